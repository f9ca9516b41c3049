"""Which layers to give a higher precision at each mixed-precision attempt, most sensitive first.

INT8 modes put the k most sensitive layers back to floating point, k = 1, 2,
4, ... up to ``limit``. W4A16 first moves the k most sensitive INT4 layers to
INT8 (half the bytes of FP16, usually enough), and only if the most
sensitive ``limit`` layers in INT8 still fail the gate, puts the first k of
them in floating point, again k = 1, 2, 4, ... up to ``limit``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Attempt:
    int8_layers: list[str]  # W4A16 layers moved to INT8
    fp_layers: list[str]  # layers kept in floating point

    @property
    def label(self) -> str:
        parts = [f"{len(self.int8_layers)} layer(s) in INT8"] if self.int8_layers else []
        parts += [f"{len(self.fp_layers)} layer(s) in FP"] if self.fp_layers else []
        return "gate: " + (", ".join(parts) or "no fallback")


def steps_up_to(n_ranked: int, limit: int) -> list[int]:
    """How many of the most sensitive layers to change at each attempt: 1, 2, 4, ... up to limit (and n_ranked)."""
    out, k = [], 1
    while k < limit:
        out.append(k)
        k *= 2
    out.append(limit)
    return [k for k in dict.fromkeys(out) if 0 < k <= n_ranked]


def fallback_attempts(ranked: list[str], limit: int, int4: bool) -> list[Attempt]:
    """The attempts in order, for layer names ``ranked`` most sensitive first."""
    ks = steps_up_to(len(ranked), limit)
    if not int4:
        return [Attempt([], ranked[:k]) for k in ks]
    top = ranked[:ks[-1]] if ks else []
    return [Attempt(ranked[:k], []) for k in ks] + [Attempt(top[k:], top[:k]) for k in ks]
