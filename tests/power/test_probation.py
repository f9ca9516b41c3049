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
