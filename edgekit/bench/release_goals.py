"""The open issues' speed goals, read off one decode-vs-llama.cpp run (``scripts/bench_decode_vs_llamacpp.py``).

Each goal names the issue that sets it, the preset shape and precision it is about, and what it compares: edgekit's
fused decode against llama.cpp on the same GGUF file (the ratio of tokens/s), against the copy-bandwidth roofline
measured in the same run, or against edgekit's own INT8 row. A goal whose rows the run did not measure says so
(``met`` None) instead of passing. The figures are the run's: measured on its GPU (the issues ask for an H200).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FUSED = "edgekit-fused"


@dataclass(frozen=True)
class SpeedGoal:
    issue: str
    model: str  # the preset
    precision: str  # edgekit's row
    kind: str  # "llama.cpp": tokens/s over llama.cpp's on the paired file; "roofline": share of it; "over": tokens/s
    # over edgekit's row of ``other`` precision
    target: float
    other: str | None = None

    def describe(self) -> str:
        what = {"llama.cpp": "x llama.cpp", "roofline": " of the copy-bandwidth roofline",
                "over": f"x edgekit {self.other}" + (" (its FP16 head)" if self.other == "int8" else "")}[self.kind]
        target = f"{self.target:.0%}" if self.kind == "roofline" else f"{self.target:g}"
        return f"{self.issue} {self.model} {self.precision} >= {target}{what}"


INT4_OVER_INT8 = 1.6  # #31: llama-3.2-1b INT4 decode >= 1.6x edgekit INT8 (H200, batch 1, depth 512)

SPEED_GOALS = (
    # the models Jetson users run (Qwen3, Gemma 3): >= 1.5x llama.cpp at batch 1, depth 512, every precision
    *(SpeedGoal("#30", m, p, "llama.cpp", 1.5) for m in ("qwen3-0.6b", "qwen3-1.7b", "gemma-3-1b")
      for p in ("fp16", "int8", "int4")),
    # to the bandwidth roofline: the 1B shape near the copy bandwidth (INT4 with its INT4 head), INT4 paying for
    # its bytes, and 3x llama.cpp where launches dominate (135M)
    SpeedGoal("#31", "llama-3.2-1b", "fp16", "roofline", 0.80),
    SpeedGoal("#31", "llama-3.2-1b", "int8", "roofline", 0.75),
    SpeedGoal("#31", "llama-3.2-1b", "int4-head", "roofline", 0.70),
    SpeedGoal("#31", "llama-3.2-1b", "int4-head", "over", INT4_OVER_INT8, other="int8"),
    SpeedGoal("#31", "smollm2-135m", "fp16", "llama.cpp", 3.0),
    SpeedGoal("#31", "smollm2-135m", "int8", "llama.cpp", 3.0),
)


# where and how the issues measure: one run on the H200, batch 1, depth 512 (a run elsewhere says so on each goal)
ISSUE_DEVICE, ISSUE_DEPTH = "H200", 512


def _figure(value) -> float | None:
    """A measured figure, or None where the row has none (missing, None, NaN)."""
    return None if value is None or math.isnan(value) else float(value)


def evaluate(doc: dict, llama_kind: dict[str, str], goals=SPEED_GOALS) -> list[dict]:
    """Each goal about a model the run ``doc`` (the script's JSON) measured: measured, target, met (None: its rows
    are missing), detail. ``llama_kind``: the llama.cpp file each precision is compared with (F16, Q8_0, Q4_K_M)."""
    models = {r["model"] for r in doc.get("edgekit", [])}
    # a row that failed (an error recorded, even after a rate) or has no rate is not a measurement
    tps = {(r["model"], r["precision"]): r for r in doc.get("edgekit", [])
           if r.get("engine") == FUSED and not r.get("error") and _figure(r.get("decode_tokens_per_s"))}
    llama = {(r["model"], r["file_kind"]): _figure(r.get("tokens_per_s")) for r in doc.get("llama_cpp", [])
             if r.get("test") == "tg" and not r.get("error")}
    device, depth = str(doc.get("device", "?")), doc.get("depth")
    conditions = ("the issues' (H200, batch 1, depth 512)" if ISSUE_DEVICE in device and depth == ISSUE_DEPTH
                  else f"not the issues' H200 at depth {ISSUE_DEPTH}: {device}, depth {depth}")
    out = []
    for g in (g for g in goals if g.model in models):
        row = tps.get((g.model, g.precision))
        measured, detail = None, None
        if row is None:
            detail = f"no {FUSED} {g.precision} row of {g.model} in this run"
        elif g.kind == "roofline":
            measured = _figure(row.get("roofline_fraction"))
            detail = f"{row['decode_tokens_per_s']:.0f} tok/s" if measured is not None else "no roofline in the row"
        else:
            if g.kind == "llama.cpp":
                kind = llama_kind[g.precision]
                base, of = llama.get((g.model, kind)), f"llama.cpp {kind}"
            else:
                other = tps.get((g.model, g.other))
                base, of = (other["decode_tokens_per_s"] if other else None), f"edgekit {g.other}"
            if base:
                measured = row["decode_tokens_per_s"] / base
                detail = f"{row['decode_tokens_per_s']:.0f} vs {base:.0f} tok/s, {of}"
            else:
                detail = f"no {of} figure of {g.model} in this run"
        out.append({"goal": g.describe(), "issue": g.issue, "model": g.model, "precision": g.precision,
                    "target": g.target, "measured": measured, "met": None if measured is None else measured >= g.target,
                    "detail": detail, "conditions": conditions})
    return out


def goal_lines(results: list[dict]) -> list[str]:
    """A line per goal: MET / MISSED with the figure, or NOT MEASURED with why."""
    lines = []
    for r in results:
        if r["met"] is None:
            lines.append(f"NOT MEASURED  {r['goal']}: {r['detail']}")
            continue
        value = f"{r['measured']:.1%}" if "roofline" in r["goal"] else f"{r['measured']:.2f}x"
        lines.append(f"{'MET' if r['met'] else 'MISSED':12}  {r['goal']}: {value} ({r['detail']})")
    if results and not results[0]["conditions"].startswith("the issues'"):
        lines.append(f"conditions: {results[0]['conditions']}: a MET here is not the issue's measurement")
    return lines
