"""Is a new operator plugin on probation worse than the one it replaced?

Two pure judgements, each returning the reasons and numbers. ``judge_paired``
compares decode steps that alternated between the new plugin's table and the
one it replaced (the server's A/B trial): same load, same batch sizes, so a
busy device cannot make a healthy plugin look slow. ``judge_probation``
compares latency windows from before and after a swap (two ``WindowStats``),
for callers without a control arm. The runtime's rollback acts on either.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from edgekit.power.latency import WindowStats


@dataclass
class ProbationVerdict:
    outcome: Literal["pass", "regressed", "undecided"]
    reasons: list[str] = field(default_factory=list)
    evidence: dict = field(default_factory=dict)

    @property
    def regressed(self) -> bool:
        return self.outcome == "regressed"


def judge_probation(
    before: WindowStats | None,
    after: WindowStats | None,
    *,
    jitter_budget_ms: float = 5.0,
    p50_tolerance: float = 0.05,
    p50_slack_ms: float = 0.1,
    jitter_tolerance_ms: float = 1.0,
    nonfinite_before: int = 0,
    nonfinite_after: int = 0,
    min_samples: int = 50,
) -> ProbationVerdict:
    """Regressed when the new plugin is slower (p50 up by more than the tolerance and the slack),
    less steady (jitter over the budget where it was not, or up by more than jitter_tolerance_ms),
    or produces non-finite values it did not before. Too few samples: undecided."""
    evidence = {
        "before": before.to_dict() if before else None, "after": after.to_dict() if after else None,
        "jitter_budget_ms": jitter_budget_ms, "nonfinite_before": nonfinite_before, "nonfinite_after": nonfinite_after,
    }
    reasons = []
    if nonfinite_after > nonfinite_before:
        reasons.append(f"non-finite outputs rose from {nonfinite_before} to {nonfinite_after}")
    if before is None or after is None or before.n < min_samples or after.n < min_samples:
        if reasons:
            return ProbationVerdict("regressed", reasons, evidence)
        n = (before.n if before else 0, after.n if after else 0)
        return ProbationVerdict("undecided", [f"need {min_samples} samples before and after, have {n[0]} and {n[1]}"], evidence)
    if after.p50_ms > before.p50_ms * (1 + p50_tolerance) + p50_slack_ms:
        reasons.append(f"p50 rose from {before.p50_ms:.3f} to {after.p50_ms:.3f} ms (> {p50_tolerance:.0%} + {p50_slack_ms} ms)")
    if after.jitter_ms > jitter_budget_ms and before.jitter_ms <= jitter_budget_ms:
        reasons.append(f"jitter {after.jitter_ms:.3f} ms is over the {jitter_budget_ms:g} ms budget (was {before.jitter_ms:.3f} ms)")
    elif after.jitter_ms > before.jitter_ms + jitter_tolerance_ms:
        reasons.append(f"jitter rose from {before.jitter_ms:.3f} to {after.jitter_ms:.3f} ms (> +{jitter_tolerance_ms:g} ms)")
    return ProbationVerdict("regressed" if reasons else "pass", reasons, evidence)


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile of sorted values (numpy's default method)."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def judge_paired(
    pairs_ms: Mapping[int, Sequence[tuple[float, float]]],
    *,
    max_slowdown: float = 0.10,
    jitter_budget_ms: float = 5.0,
    jitter_tolerance: float = 0.5,
    min_samples: int = 64,
    faults: int = 0,
    final: bool = False,
    z: float = 1.96,
) -> ProbationVerdict:
    """A new plugin against the table it replaced, on decode steps that ran in pairs, one on each arm back to back
    in a random order (the server's A/B trial): ``pairs_ms`` maps a batch size to (trial ms, control ms) pairs, so
    load, batch size and whatever ran beside them are the same on both sides of every pair.

    Under load a step's time is bimodal: it waited for the GIL (or a core) or it did not, and that wait is added to
    whichever arm it hits. So the slowdown is the median of the pairs' differences (the waits cancel out around it,
    which they do not in either arm's own median, nor in a ratio), over the control's quick steps (its p25):
    ``slowdown = median(trial - control) / p25(control)``. With the median's distribution-free confidence interval
    (order statistics, ``z``): regressed when the whole interval is above ``max_slowdown``, passed when it is all
    below, undecided in between (more pairs narrow it) -- unless ``final``, where the median itself decides.
    Also regressed: a trial whose slow steps are slower (p90) than the control's by more than ``jitter_budget_ms``
    plus ``jitter_tolerance`` of the control's p90, at a batch size with ``min_samples`` pairs (a plugin that stalls
    now and then); or a fault. Fewer than ``min_samples`` pairs: undecided."""
    evidence: dict = {"batches": {}, "max_slowdown": max_slowdown, "jitter_budget_ms": jitter_budget_ms,
                      "min_samples": min_samples, "faults": faults}
    reasons = [f"{faults} fault(s) (non-finite output or a failed launch)"] if faults else []
    for b in sorted(pairs_ms):
        pairs = pairs_ms[b]
        row = evidence["batches"][b] = {"pairs": len(pairs)}
        if len(pairs) < min_samples:
            continue
        t, c = sorted(p[0] for p in pairs), sorted(p[1] for p in pairs)
        t90, c90 = _quantile(t, 0.9), _quantile(c, 0.9)
        row.update(p50_ms=[round(_quantile(t, 0.5), 4), round(_quantile(c, 0.5), 4)], p90_ms=[round(t90, 4), round(c90, 4)])
        if t90 - c90 > jitter_budget_ms + jitter_tolerance * c90:
            reasons.append(f"slow steps (p90) {t90:.2f} ms vs the control's {c90:.2f} ms at batch {b} (budget "
                           f"{jitter_budget_ms:g} ms + {jitter_tolerance:.0%} of the control's)")
    all_pairs = [pair for pairs in pairs_ms.values() for pair in pairs]
    n = len(all_pairs)
    if n < min_samples:
        if reasons:
            return ProbationVerdict("regressed", reasons, evidence)
        return ProbationVerdict("undecided", [f"need {min_samples} step pairs (trial, control); have {n}"], evidence)
    diffs = sorted(t - c for t, c in all_pairs)
    quick = max(_quantile(sorted(c for _, c in all_pairs), 0.25), 1e-9)
    k = max(0, int(n / 2 - z * math.sqrt(n) / 2))
    mid, lo, hi = (_quantile(diffs, 0.5) / quick, diffs[k] / quick, diffs[n - 1 - k] / quick)
    evidence.update(step_time_ratio=round(1 + mid, 4), ratio_interval=[round(1 + lo, 4), round(1 + hi, 4)], pairs=n,
                    control_p25_ms=round(quick, 4))
    if lo > max_slowdown or (final and mid > max_slowdown):
        reasons.append(f"decode steps took {1 + mid:.2f}x the control's (95% {1 + lo:.2f}-{1 + hi:.2f}x over {n} pairs "
                       f"at the same batch sizes; at most {1 + max_slowdown:.2f}x allowed)")
    if reasons:
        return ProbationVerdict("regressed", reasons, evidence)
    if hi <= max_slowdown or final:
        return ProbationVerdict("pass", [], evidence)
    return ProbationVerdict("undecided", [f"decode steps {1 + mid:.2f}x the control's (95% {1 + lo:.2f}-{1 + hi:.2f}x "
                                          f"over {n} pairs) straddle the {1 + max_slowdown:.2f}x limit: more pairs "
                                          "needed"], evidence)
