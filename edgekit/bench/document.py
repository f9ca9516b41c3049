"""The benchmark's JSON document: rows as measured, ratios between them, goals checked against them.

Pure data: no GPU, no timing. The runner fills ``Row`` objects; ``finish``
derives the ratios (edgekit's runtime over every baseline measured at the same
model and context) and evaluates the issue's goals, which are tied to model
*shapes* (the default model's shape, ``preset:qwen2.5-1.5b``), not to names.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from edgekit.model.config import ModelConfig
from edgekit.model.presets import PRESETS

SCHEMA = "edgekit.bench/1"

PRECISIONS = {
    "fp16": "FP16 weights everywhere",
    "int8": "INT8 weight-only (W8A16, per-channel FP32 scales) for every block linear; LM head FP16",
    "int8-head": "INT8 weight-only (W8A16) for every block linear and the LM head",
    "int4": "INT4 weight-only (W4A16, round-to-nearest, group 128 or the largest group dividing K, FP16 scales and "
            "offsets: uncalibrated, for speed) for every block linear; LM head FP16",
    "int4-head": "INT4 weight-only (W4A16, round-to-nearest, for speed) for every block linear and the LM head",
}
INT8_PRECISIONS = ("int8", "int8-head")
EDGEKIT_ENGINES = ("edgekit", "edgekit-fused")  # edgekit's per-operator and fused decode paths: the left side of a ratio
# llama.cpp's file types and the edgekit precisions each is compared with (same bits per weight class);
# a llama.cpp row of another type is shown but has no ratio
LLAMA_CPP_MATCH = {"F16": ("fp16",), "Q8_0": INT8_PRECISIONS, "Q4_K_M": ("int4",)}


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Roofline(_Doc):
    bytes_per_token: int
    weight_bytes: int
    kv_bytes: int
    attended_len: float
    tokens_per_s: float  # the ceiling: copy bandwidth / bytes per token
    fraction: Optional[float] = None  # measured decode tokens/s over the ceiling


PARTITION_ENGINE = "edgekit-fused-sms"  # edgekit's fused decode confined to part of the GPU (edgekit bench --sms)
# the tiles a confined run is measured with: the planner's for the orin target first (the question: do they win there?)
TILE_CANDIDATES = {
    "orin-plan": "the planner's tiles for target orin (edgekit plan --target orin, at this model and context), "
                 "launch rules sized for the partition's SMs (as an Orin sizes them for its own)",
    "jit-default": "the Triton JIT's default tiles (what the whole-GPU edgekit-fused rows run), launch rules sized for "
                   "the partition's SMs",
    "orin-plan@device-sms": "the planner's orin tiles, launch rules sized for the whole device's SMs (split-KV / "
                            "split-K as on the whole GPU)",
}
ORIN_PLAN = "orin-plan"
WIN_TOLERANCE = 0.02  # the orin plan "wins" within 2% of the best candidate: repeats of one figure vary about that much


class SmPartition(_Doc):
    """Where a PARTITION_ENGINE row ran: which SMs, with which tiles, against which copy bandwidth."""

    requested_sms: int
    confined: bool  # False: no green context here, nothing was confined (``reason``; what ran instead: ``instead``)
    tiles: str  # a TILE_CANDIDATES key ("-": nothing ran)
    sm_count: Optional[int] = None  # SMs the green context holds: CUDA rounds a request up to its granularity
    sm_count_source: str = ""
    observed_sms: Optional[int] = None  # distinct SMs a wide probe grid launched into the partition ran on
    device_sms: Optional[int] = None
    api: Optional[str] = None  # what made the green context
    launch_rule_sms: Optional[int] = None  # the SM count the launch rules sized grids for
    tile_choices: dict[str, str] = Field(default_factory=dict)  # fused-step kernel -> the variant that ran
    copy_bytes_per_s: Optional[float] = None  # the roofline's bandwidth: the kernel copy measured in the partition
    copy_bandwidth: dict[str, dict] = Field(default_factory=dict)  # "kernel", "memcpy" (inside), "kernel_whole_device"
    reason: Optional[str] = None
    instead: Optional[str] = None


class Row(_Doc):
    model: str
    precision: str
    engine: str
    engine_label: str
    context: int
    status: Literal["ok", "failed", "skipped"] = "ok"
    error: Optional[str] = None
    measured_on: str = ""
    new_tokens: Optional[int] = None
    decode_tokens_per_s: Optional[float] = None
    decode_ms_per_token: Optional[float] = None
    decode_s_repeats: list[float] = Field(default_factory=list)
    prefill_tokens_per_s: Optional[float] = None
    ttft_ms: Optional[float] = None
    prefill_s_repeats: list[float] = Field(default_factory=list)
    prefill_note: str = ""
    prefill_graphed_tokens_per_s: Optional[float] = None
    prefill_graphed_ttft_ms: Optional[float] = None
    prefill_graphed_error: Optional[str] = None
    peak_memory_bytes: Optional[int] = None
    resident_bytes_at_start: Optional[int] = None
    power_w: Optional[float] = None
    energy_mj_per_token: Optional[float] = None
    energy_window_s: Optional[float] = None
    energy_note: Optional[str] = None
    tokens_checked: int = 0
    tokens_match: Optional[bool] = None
    first_mismatch: Optional[int] = None
    tokens: list[int] = Field(default_factory=list)
    reference_tokens: list[int] = Field(default_factory=list)
    reference_margins: list[float] = Field(default_factory=list)  # the reference's top-1 minus top-2 logit per step
    margin_at_mismatch: Optional[float] = None  # at the first differing token
    logit_scale_at_mismatch: Optional[float] = None  # the reference's largest |logit| there
    roofline: Optional[Roofline] = None
    profile: Optional[dict] = None  # edgekit rows: kernels per token, kernel vs wall time, top kernels
    baseline_detail: Optional[dict] = None  # llama.cpp rows: file, stdev, build, the command that ran
    partition: Optional[SmPartition] = None  # PARTITION_ENGINE rows: the SMs, tiles and bandwidth of the run


class Ratio(_Doc):
    model: str
    context: int
    precision: str  # edgekit runtime's
    engine: str = "edgekit"  # which edgekit path (EDGEKIT_ENGINES)
    baseline: str
    baseline_precision: str
    decode_speedup: float  # edgekit decode tokens/s over the baseline's
    ttft_speedup: Optional[float] = None  # baseline time to first token over edgekit's


class GoalResult(_Doc):
    goal: str
    model: str
    precision: str
    context: int
    target: float
    measured: Optional[float] = None
    met: Optional[bool] = None  # None: not measurable in this run (see detail)
    detail: str = ""


class PartitionResult(_Doc):
    """One (model, precision, SMs asked, context) of edgekit bench --sms: every tile candidate's decode, which won."""

    model: str
    precision: str
    requested_sms: int
    context: int
    sm_count: Optional[int] = None
    confined: bool = False
    copy_bytes_per_s: Optional[float] = None
    decode_tokens_per_s: dict[str, float] = Field(default_factory=dict)  # tile candidate -> tokens/s (rows that ran)
    roofline_fraction: dict[str, float] = Field(default_factory=dict)  # candidate -> of the partition's copy roofline
    best: Optional[str] = None  # the candidate with the highest decode rate
    orin_plan_vs_best: Optional[float] = None  # the orin plan's rate over the best's (1.0: it is the best)
    orin_plan_wins: Optional[bool] = None  # within WIN_TOLERANCE of the best
    whole_device_tokens_per_s: Optional[float] = None  # the run's edgekit-fused row (all SMs, JIT tiles)
    orin_tiles: dict[str, str] = Field(default_factory=dict)  # the fused step's kernels as the orin plan tiles them
    detail: str = ""  # what did not run, and why


class BenchDocument(_Doc):
    schema_: str = Field(SCHEMA, alias="schema")
    measured_on: str
    created: str
    command: str = ""
    device: dict
    settings: dict
    copy_bandwidth: Optional[dict] = None
    models: dict[str, dict] = Field(default_factory=dict)
    rows: list[Row] = Field(default_factory=list)
    ratios: list[Ratio] = Field(default_factory=list)
    goals: list[GoalResult] = Field(default_factory=list)
    mismatches: list[str] = Field(default_factory=list)
    sm_partitions: list[PartitionResult] = Field(default_factory=list)  # edgekit bench --sms, derived from the rows
    notes: list[str] = Field(default_factory=list)
    elapsed_s: Optional[float] = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json_dict(self) -> dict:
        return self.model_dump(by_alias=True, mode="json")


# --------------------------------------------------------------------------- ratios
def ratios(rows: list[Row]) -> list[Ratio]:
    """edgekit's runtime over every baseline measured at the same model and context (both rows ok); llama.cpp's
    rows only at the precision their file type matches (``LLAMA_CPP_MATCH``)."""
    # confined rows are edgekit's too, on part of the GPU: compared with each other (partition_results), never paired
    ok = [r for r in rows if r.status == "ok" and r.decode_tokens_per_s and r.engine != PARTITION_ENGINE]
    out = []
    for e in (r for r in ok if r.engine in EDGEKIT_ENGINES):
        for b in (r for r in ok if r.engine not in EDGEKIT_ENGINES and r.model == e.model and r.context == e.context):
            if b.engine == "llama.cpp" and e.precision not in LLAMA_CPP_MATCH.get(b.precision, ()):
                continue  # F16 with fp16, Q8_0 with int8: not every file with every precision
            ttft = b.ttft_ms / e.ttft_ms if (b.ttft_ms and e.ttft_ms) else None
            out.append(Ratio(model=e.model, context=e.context, precision=e.precision, engine=e.engine, baseline=b.engine,
                             baseline_precision=b.precision, decode_speedup=e.decode_tokens_per_s / b.decode_tokens_per_s,
                             ttft_speedup=ttft))
    return out


# --------------------------------------------------------------------------- goals
def shape_of(cfg: ModelConfig) -> Optional[str]:
    """The preset whose shape ``cfg`` has (names, token ids and max length aside), else None."""
    ignore = {"name", "bos_token_id", "eos_token_ids", "max_position_len", "rope_scaling"}

    def key(c: ModelConfig) -> tuple:
        return tuple((f.name, getattr(c, f.name)) for f in dataclasses.fields(c) if f.name not in ignore)

    for name, preset in PRESETS.items():
        if key(preset) == key(cfg):
            return name
    return None


@dataclasses.dataclass(frozen=True)
class Goal:
    goal: str
    shape: str  # preset whose shape the goal is about
    kind: Literal["ratio", "roofline"]
    target: float
    baseline: Optional[str] = None
    baseline_precision: Optional[str] = None  # None: the same precision as edgekit's row


GOALS = (
    Goal("edgekit INT8 decode >= 50x transformers eager generate (FP16), default model's shape",
         "smollm2-135m", "ratio", 50.0, "hf-eager", "fp16"),
    Goal("edgekit INT8 decode >= 60% of the INT8 bandwidth roofline", "qwen2.5-1.5b", "roofline", 0.60),
    Goal("edgekit INT8 decode >= 1.6x torch.compile FP16", "qwen2.5-1.5b", "ratio", 1.6, "compile", "fp16"),
    Goal("edgekit INT8 decode >= 1.1x torch.compile of the same INT8 model", "qwen2.5-1.5b", "ratio", 1.1, "compile", None),
)


def _find(rows: list[Row], model: str, engine: str, precision: str, context: int) -> Optional[Row]:
    for r in rows:
        if (r.model, r.engine, r.precision, r.context) == (model, engine, precision, context):
            return r
    return None


def _why_missing(row: Optional[Row], what: str) -> str:
    if row is None:
        return f"{what} was not run"
    return f"{what} {row.status}: {row.error or 'no decode rate'}"


def evaluate_goals(rows: list[Row], shapes: dict[str, Optional[str]], goals=GOALS) -> list[GoalResult]:
    """Each goal at each context of each INT8 edgekit row of a model with the goal's shape.

    ``shapes`` maps a row's model name to its preset shape (``shape_of``).
    """
    out = []
    for g in goals:
        for e in rows:
            if e.engine != "edgekit" or e.precision not in INT8_PRECISIONS or shapes.get(e.model) != g.shape:
                continue
            res = GoalResult(goal=g.goal, model=e.model, precision=e.precision, context=e.context, target=g.target)
            if e.status != "ok" or not e.decode_tokens_per_s:
                res.detail = _why_missing(e, "the edgekit row")
            elif g.kind == "roofline":
                if e.roofline is None or e.roofline.fraction is None:
                    res.detail = "no roofline (copy bandwidth not measured)"
                else:
                    res.measured = e.roofline.fraction
            else:
                bp = g.baseline_precision or e.precision
                b = _find(rows, e.model, g.baseline, bp, e.context)
                if b is None or b.status != "ok" or not b.decode_tokens_per_s:
                    res.detail = _why_missing(b, f"the {g.baseline} {bp} row")
                else:
                    res.measured = e.decode_tokens_per_s / b.decode_tokens_per_s
                    res.detail = f"{e.decode_tokens_per_s:.1f} vs {b.decode_tokens_per_s:.1f} tok/s"
            if res.measured is not None:
                res.met = res.measured >= g.target
                if not res.met:
                    res.detail = (res.detail + "; " if res.detail else "") + f"missed by {g.target / res.measured:.2f}x"
            out.append(res)
    return out


NEAR_TIE = 0.01  # a reference margin under 1% of its largest logit: FP16 rounding order can flip it


def margin_verdict(margin: float | None, scale: float | None) -> str:
    """How to read a token that differs: "near-tie" when the reference's own top two logits were within NEAR_TIE of
    its largest logit, else "wide margin" (worth a look: rounding alone rarely flips it)."""
    if margin is None or not scale:
        return "margin unknown"
    rel = margin / scale
    return f"{'near-tie' if rel < NEAR_TIE else 'wide margin'}: the reference's top two logits {margin:.4g} apart ({rel:.2%} of its largest)"


def mismatches(rows: list[Row]) -> list[str]:
    """One line per row whose greedy tokens differ from the reference path's, with the reference's margin there."""
    out = []
    for r in rows:
        if r.tokens_match is False:
            where = "" if r.partition is None else f" ({r.partition.sm_count or r.partition.requested_sms} SMs, {r.partition.tiles})"
            out.append(f"{r.model} {r.precision} {r.engine}{where} ctx {r.context}: token {r.first_mismatch} differs, "
                       f"{margin_verdict(r.margin_at_mismatch, r.logit_scale_at_mismatch)} "
                       f"(got {r.tokens}, reference {r.reference_tokens})")
    return out


def partition_results(rows: list[Row]) -> list[PartitionResult]:
    """PARTITION_ENGINE rows grouped by (model, precision, SMs asked, context): each candidate's rate, the best, and how
    the orin plan's tiles did against it."""
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.engine == PARTITION_ENGINE and r.partition is not None:
            groups.setdefault((r.model, r.precision, r.partition.requested_sms, r.context), []).append(r)
    out = []
    for (model, precision, asked, context), group in groups.items():
        res = PartitionResult(model=model, precision=precision, requested_sms=asked, context=context)
        why = []
        for r in group:
            p = r.partition
            res.sm_count = res.sm_count or p.sm_count
            res.confined = res.confined or p.confined
            res.copy_bytes_per_s = res.copy_bytes_per_s or p.copy_bytes_per_s
            if p.tiles == ORIN_PLAN and p.tile_choices:
                res.orin_tiles = dict(p.tile_choices)
            if r.status == "ok" and r.decode_tokens_per_s:
                res.decode_tokens_per_s[p.tiles] = r.decode_tokens_per_s
                if r.roofline is not None and r.roofline.fraction is not None:
                    res.roofline_fraction[p.tiles] = r.roofline.fraction
            elif r.error != p.reason:  # a reason the partition already gives is said once, below
                why.append(f"{p.tiles}: {r.status}" + (f" ({r.error})" if r.error else ""))
        if res.decode_tokens_per_s:
            res.best = max(res.decode_tokens_per_s, key=res.decode_tokens_per_s.get)
            if ORIN_PLAN in res.decode_tokens_per_s:
                res.orin_plan_vs_best = res.decode_tokens_per_s[ORIN_PLAN] / res.decode_tokens_per_s[res.best]
                res.orin_plan_wins = res.orin_plan_vs_best >= 1 - WIN_TOLERANCE
        whole = _find(rows, model, "edgekit-fused", precision, context)
        if whole is not None and whole.status == "ok":
            res.whole_device_tokens_per_s = whole.decode_tokens_per_s
        unconfined = sorted({f"not confined: {r.partition.reason}; instead: {r.partition.instead or 'nothing ran'}"
                             for r in group if not r.partition.confined and r.partition.reason})
        res.detail = "; ".join(unconfined + why)
        out.append(res)
    return out


def finish(doc: BenchDocument, shapes: dict[str, Optional[str]]) -> BenchDocument:
    doc.ratios = ratios(doc.rows)
    doc.goals = evaluate_goals(doc.rows, shapes)
    doc.mismatches = mismatches(doc.rows)
    doc.sm_partitions = partition_results(doc.rows)
    return doc
