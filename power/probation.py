"""Is a new operator plugin on probation worse than the one it replaced?

The runtime swaps a plugin, keeps latency windows from before and after (two
``WindowStats`` from a ``LatencyTracker``) and counts non-finite outputs; this
pure function says whether that is a regression, with the reasons and numbers.
The runtime's rollback callback acts on it.
"""

from __future__ import annotations

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
