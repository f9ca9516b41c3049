"""Probation verdicts for a swapped operator plugin."""

from __future__ import annotations

from edgekit.power.latency import window_stats
from edgekit.power.probation import judge_probation


def _w(values):
    return window_stats("token", values, 10.0)


STEADY = [6.0 + 0.01 * (i % 10) for i in range(200)]


def test_same_numbers_pass():
    v = judge_probation(_w(STEADY), _w(STEADY))
    assert v.outcome == "pass" and not v.reasons


def test_slower_plugin_regresses():
    v = judge_probation(_w(STEADY), _w([x * 1.2 for x in STEADY]))
    assert v.regressed and "p50 rose" in v.reasons[0]


def test_jitter_over_budget_regresses_even_at_the_same_p50():
    spiky = STEADY[:190] + [15.0] * 10  # p99 - p50 = 9 ms
    v = judge_probation(_w(STEADY), _w(spiky))
    assert v.regressed and "over the 5 ms budget" in v.reasons[0]
    assert v.evidence["after"]["jitter_ms"] > 5.0


def test_nonfinite_outputs_regress_even_without_enough_samples():
    v = judge_probation(_w(STEADY[:5]), _w(STEADY[:5]), nonfinite_after=3)
    assert v.regressed and "non-finite" in v.reasons[0]


def test_too_few_samples_is_undecided():
    v = judge_probation(_w(STEADY), _w(STEADY[:10]))
    assert v.outcome == "undecided"


# -- judge_paired: the server's A/B trial ---------------------------------------------------------------------


def _pairs(n: int, slowdown: float, seed: int, contended: float = 0.5) -> dict[int, list[tuple[float, float]]]:
    """Step pairs as a loaded CPU gives them: ~3 ms, or ~20 ms when the step waited for the GIL (either arm, at
    random, `contended` of the time), a few percent of timing noise; the trial arm `slowdown` slower."""
    import random

    rnd = random.Random(seed)

    def step(base: float) -> float:
        return base * rnd.gauss(1.0, 0.05) + (rnd.uniform(10, 25) if rnd.random() < contended else 0.0)

    return {4: [(step(3.0 * (1 + slowdown)), step(3.0)) for _ in range(n)]}


def test_an_identical_plugin_under_a_bimodal_load_passes_once_the_interval_is_clear():
    from edgekit.power.probation import judge_paired

    verdicts = [judge_paired(_pairs(400, 0.0, seed)) for seed in range(100)]
    assert not any(v.regressed for v in verdicts)  # at worst undecided: the trial goes on
    assert sum(v.outcome == "pass" for v in verdicts) >= 90
    assert all(judge_paired(_pairs(1600, 0.0, seed)).outcome == "pass" for seed in range(20))  # more pairs decide


def test_a_20_percent_slower_plugin_is_regressed_whatever_the_load_adds():
    from edgekit.power.probation import judge_paired

    verdicts = [judge_paired(_pairs(400, 0.2, seed)) for seed in range(20)]
    assert all(v.regressed and "control's" in v.reasons[0] for v in verdicts), [v.evidence for v in verdicts]


def test_a_ratio_near_the_limit_waits_for_more_pairs_and_the_final_look_decides():
    from edgekit.power.probation import judge_paired

    near = _pairs(80, 0.10, 3)
    assert judge_paired(near).outcome == "undecided"
    assert judge_paired(near, final=True).outcome in ("pass", "regressed")
    assert judge_paired({4: near[4][:10]}).outcome == "undecided"  # fewer pairs than min_samples


def test_a_trial_with_a_wider_spread_or_a_fault_is_regressed():
    from edgekit.power.probation import judge_paired

    spiky = {4: [(3.0 + (30.0 if i % 5 == 0 else 0.0), 3.0) for i in range(200)]}  # every fifth trial step stalls
    v = judge_paired(spiky)
    assert v.regressed and "slow steps (p90)" in " ".join(v.reasons)
    assert judge_paired({}, faults=1).regressed
