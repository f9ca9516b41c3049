"""The planner: for one model on one target, everything the build will do, and why.

    make_plan(model, target) -> Plan
        precision per operator / layer
        static shapes (buckets, context, batch) and how they serve a trace
        decode split-K factor that fills the target's SMs
        memory plan (refuses a misfit with what would fit)
        tiles per shared-memory operator, confirmed by compiling for the target arch
        roofline predictions per power mode

The memory check runs before any compile, so a plan that cannot fit fails in
milliseconds. ``Plan.to_dict()`` is what the build writes into the bundle
manifest; ``Plan.from_dict`` reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from edgekit import __version__
from edgekit.errors import PlanError
from edgekit.kernels.attention import DECODE_PROGRAMS_PER_SM
from edgekit.kernels.attention import decode_splits as attention_decode_splits
from edgekit.model.config import ModelConfig
from edgekit.plan import buckets as bk
from edgekit.plan.memory import MemoryPlan, fit_options, misfit_error, plan_memory
from edgekit.plan.precision import KV_PRECISIONS, PrecisionPlan, scheme_for_cli
from edgekit.plan.roofline import roofline_assumptions, roofline_table
from edgekit.plan.targets import Target
from edgekit.graph.node import DECODE, PREFILL
from edgekit.graph.paths import FUSED, PER_OPERATOR, fused_blocker, fused_step_operators, path_graph, registry_ops
from edgekit.plan.launches import count_pass
from edgekit.plan.tiles import ShapeFacts, TileChoice, kernel_shapes, needed_ops, solve_all
from edgekit.shapes import DEFAULT_MAX_SEQ_LEN, StaticShapes

PLAN_FORMAT = "edgekit-plan"
PLAN_FORMAT_VERSION = 1

DEFAULT_DECODE_BLOCK_N = 32  # the smallest decode BLOCK_N: the most splits, before the solver has chosen
DEFAULT_DECODE_MAX_SPLITS = 128  # the largest workspace any decode variant allocates


def decode_splits(
    target: Target, batch: int, n_kv_heads: int, context: int, block_n: int, max_splits: int | None = None,
    programs_per_sm: int = DECODE_PROGRAMS_PER_SM,
) -> int:
    """The decode launch rule's split count (kernels.attention.decode_splits) on ``target``'s SMs."""
    return attention_decode_splits(target.gpu.sms, batch, n_kv_heads, context, block_n, max_splits, programs_per_sm)


@dataclass
class Plan:
    model: dict  # name, config, source
    target: dict  # the target's summary
    power_mode: str
    shapes: dict  # buckets, context (KV cache length), batch
    buckets: dict  # how the buckets were chosen and how they serve a trace
    precision: PrecisionPlan
    decode: dict  # split-K factor and the rule that chose it
    memory: MemoryPlan
    tiles: list[TileChoice]  # one per kernel the build compiles, in the order it compiles them
    roofline: list[dict]  # per power mode, all predicted
    roofline_assumptions: dict
    versions: dict
    notes: list[str] = field(default_factory=list)

    def operators(self) -> list[str]:
        """The operators this plan runs on every path (decided by its precision, read from the model's graph)."""
        return needed_ops(ModelConfig.from_dict(self.model["config"]), self.precision)

    def variants(self, op: str) -> dict:
        """kernel -> KernelVariant the plan chose for ``op``: exactly what the build compiles."""
        return {t.kernel: t.variant for t in self.tiles if t.op == op}

    @property
    def static_shapes(self) -> StaticShapes:
        return StaticShapes(tuple(self.shapes["buckets"]), self.shapes["context"], self.shapes["batch"])

    def to_dict(self) -> dict:
        return {
            "format": PLAN_FORMAT,
            "format_version": PLAN_FORMAT_VERSION,
            "model": self.model,
            "target": self.target,
            "power_mode": self.power_mode,
            "shapes": self.shapes,
            "buckets": self.buckets,
            "precision": self.precision.to_dict(),
            "operators": operator_rows(ModelConfig.from_dict(self.model["config"]), self.precision),
            "decode": self.decode,
            "memory": self.memory.to_dict(),
            "tiles": [t.to_dict() for t in self.tiles],
            "roofline": self.roofline,
            "roofline_assumptions": self.roofline_assumptions,
            "versions": self.versions,
            "notes": self.notes,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        if d.get("format") != PLAN_FORMAT or d.get("format_version") != PLAN_FORMAT_VERSION:
            raise PlanError(
                f"not a plan this edgekit reads: format {d.get('format')!r} version {d.get('format_version')!r}, "
                f"expected {PLAN_FORMAT!r} version {PLAN_FORMAT_VERSION}",
                hint="re-plan with this edgekit version",
            )
        return cls(
            model=d["model"], target=d["target"], power_mode=d["power_mode"], shapes=d["shapes"], buckets=d["buckets"],
            precision=PrecisionPlan.from_dict(d["precision"]), decode=d["decode"], memory=MemoryPlan.from_dict(d["memory"]),
            tiles=[TileChoice.from_dict(t) for t in d["tiles"]], roofline=d["roofline"], roofline_assumptions=d["roofline_assumptions"],
            versions=d["versions"], notes=list(d.get("notes", [])),
        )


def operator_rows(cfg: ModelConfig, pp: PrecisionPlan) -> list[dict]:
    """plan.json's "operators": every operator the bundle runs (``needed_ops``), each with its precision and the paths
    that call it ("prefill", "decode" (per operator), "fused")."""
    from edgekit.kernels.registry import operator

    schemes = pp.linear_schemes()
    graphs = {"prefill": path_graph(cfg, schemes, PREFILL), "decode": path_graph(cfg, schemes, DECODE)}
    if fused_blocker(cfg, schemes, pp.kv_cache) is None:
        graphs["fused"] = path_graph(cfg, schemes, DECODE, FUSED)
    calls = {name: set(registry_ops(g)) for name, g in graphs.items()}
    return [dict(operator(op).precision.to_dict(), paths=[p for p, ops in calls.items() if op in ops])
            for op in needed_ops(cfg, pp)]


def _planned_variants(tiles: list[TileChoice], cfg: ModelConfig, target: Target, pp: PrecisionPlan, *, batch: int,
                      max_bucket: int, context: int) -> Callable[[str], dict]:
    """op -> {kernel: variant}: the solved tiles, else (--no-tiles) each kernel's default at the shape it would be solved at."""
    from edgekit.kernels.variants import default_variants

    facts = ShapeFacts(cfg, batch, max_bucket, context, pp)

    def variants(op: str) -> dict:
        chosen = {t.kernel: t.variant for t in tiles if t.op == op}
        if chosen:
            return chosen
        return {kernel: default_variants(op, dtype="fp16", **shape)[kernel] for kernel, shape in kernel_shapes(op, facts).items()}

    return variants


def _versions() -> dict:
    try:
        import triton

        tv = triton.__version__
    except Exception:  # triton is optional on hosts that only read plans
        tv = None
    return {"edgekit": __version__, "triton": tv}


def _choose_shapes(
    cfg: ModelConfig, context: int, batch: int, trace_path: Path | str | None, given: tuple[int, ...] | None, max_buckets: int,
) -> tuple[tuple[int, ...], dict]:
    trace = bk.load_trace(trace_path) if trace_path else None
    if given:
        too_long = [b for b in given if b > context]
        if too_long:
            raise PlanError(
                f"buckets {too_long} exceed the context of {context} tokens",
                hint=f"drop them or raise --context to at least {max(too_long)}",
            )
        chosen, method = given, "given"
    elif trace is not None:
        chosen, method = bk.choose_buckets(trace, context, max_buckets), f"optimal for the trace (at most {max_buckets}, DP)"
    else:
        chosen, method = StaticShapes.for_context(context, batch).buckets, "default powers of two"
    info: dict = {"method": method, "trace": None, "uniform": None}
    if trace is not None:
        info["trace"] = {"source": trace.source, "requests": len(trace), **bk.evaluate(chosen, trace, context, method).to_dict()}
        uni = bk.uniform_buckets(trace, context, max_buckets)
        info["uniform"] = bk.evaluate(uni, trace, context, "uniform").to_dict()
    return tuple(chosen), info


def make_plan(
    cfg: ModelConfig,
    target: Target,
    *,
    model_info: dict | None = None,
    context: int | None = None,
    batch: int = 1,
    precision: str | PrecisionPlan = "fp16",
    kv_precision: str = "fp16",
    trace: Path | str | None = None,
    buckets: tuple[int, ...] | None = None,
    max_buckets: int = bk.DEFAULT_MAX_BUCKETS,
    power_mode: str | None = None,
    solve_tiles: bool = True,
    progress: Callable[[str], None] | None = None,
    compile_fn: Callable | None = None,
) -> Plan:
    """Plan ``cfg`` for ``target``. Raises PlanError when it cannot fit (with what would).

    ``precision`` is a --precision value (every projection in that scheme: a plan made before quantization)
    or the PrecisionPlan quantization decided, per layer (what the build plans with). ``compile_fn(variant)``
    overrides how the tile solver compiles (the build passes one that uses its cache).
    """
    if batch < 1:
        raise PlanError(f"batch must be >= 1, got {batch}")
    if context is None:
        context = min(DEFAULT_MAX_SEQ_LEN, cfg.max_position_len)
    if context < 16:
        raise PlanError(f"context must be >= 16 tokens, got {context}")
    if context > cfg.max_position_len:
        raise PlanError(
            f"context {context} exceeds what {cfg.name} was trained for ({cfg.max_position_len} positions)",
            hint=f"use --context {cfg.max_position_len} or less",
        )
    if kv_precision not in KV_PRECISIONS:
        raise PlanError(f"unknown KV cache precision {kv_precision!r}; expected one of: {', '.join(KV_PRECISIONS)}")
    mode = target.power_mode(power_mode)
    if isinstance(precision, PrecisionPlan):
        pp = precision
        if len(pp.layers) != cfg.n_layers:
            raise PlanError(f"the precision plan has {len(pp.layers)} layers; {cfg.name} has {cfg.n_layers}")
        used = [s for s in pp.schemes_used() if s != "fp16"]
        scheme = used[0] if used else "fp16"  # the scheme a misfit's alternatives start from
        kv_precision = pp.kv_cache
    else:
        scheme = scheme_for_cli(precision)
        pp = PrecisionPlan.uniform(cfg, scheme, kv_precision)
        if scheme != "fp16":
            pp.notes.append(
                f"--precision {precision}: every block projection uses {scheme}; quantization may keep sensitive layers in fp16"
            )

    chosen, bucket_info = _choose_shapes(cfg, context, batch, trace, buckets, max_buckets)
    shapes = StaticShapes(chosen, context, batch)  # validates the combination

    # Memory first (no compile needed): the workspace is sized for the largest decode variant.
    def memory(max_splits: int) -> MemoryPlan:
        return plan_memory(cfg, target, pp, context=context, batch=batch, max_bucket=chosen[-1], decode_slots=max_splits)

    mem = memory(DEFAULT_DECODE_MAX_SPLITS)
    if not mem.fits:
        opts = fit_options(cfg, target, scheme=scheme, kv_precision=kv_precision, context=context, batch=batch,
                           max_bucket=chosen[-1], decode_slots=DEFAULT_DECODE_MAX_SPLITS)
        raise misfit_error(cfg, target, mem, opts)

    tiles: list[TileChoice] = []
    block_n, max_splits = DEFAULT_DECODE_BLOCK_N, DEFAULT_DECODE_MAX_SPLITS
    notes: list[str] = []
    if solve_tiles:
        tiles = solve_all(cfg, target, pp, batch=batch, buckets=chosen, context=context, dtype="fp16", progress=progress,
                          compile_fn=compile_fn)
        for c in tiles:
            if c.kernel == "attention_decode_split":
                block_n = int(c.constexprs["BLOCK_N"])
                max_splits = int(c.constexprs.get("MAX_SPLITS", max_splits))
    else:
        notes.append("tiles not solved (--no-tiles): no shared-memory figure in this plan; "
                     "decode splits assume the smallest decode tile")
    splits = decode_splits(target, batch, cfg.n_kv_heads, context, block_n, max_splits)
    mem = memory(max_splits)

    variants = _planned_variants(tiles, cfg, target, pp, batch=batch, max_bucket=chosen[-1], context=context)

    schemes = pp.linear_schemes()
    no_fused = fused_blocker(cfg, schemes, pp.kv_cache)
    decode_path_name = PER_OPERATOR if no_fused else FUSED
    smem = target.gpu.shared_memory.per_block_optin_bytes

    def decode_kernels(sms: int) -> dict:
        """The decode step the bundle will run (the fused path where its weights allow, else per operator), counted."""
        counted = count_pass(cfg, pp, variants, phase=DECODE, path=decode_path_name, batch=batch, tokens=1,
                             context=context, sm_count=sms, max_shared_bytes=smem)
        return {"path": decode_path_name, **counted}

    def kernel_counts(mode) -> tuple[int, int]:
        prefill = count_pass(cfg, pp, variants, phase=PREFILL, path=PER_OPERATOR, batch=batch, tokens=chosen[-1],
                             context=context, sm_count=mode.active_sms, max_shared_bytes=smem)["total"]
        return decode_kernels(mode.active_sms)["total"], prefill

    roof = roofline_table(cfg, pp, target, batch=batch, context=context, prefill_bucket=chosen[-1],
                          kernel_counts=kernel_counts)
    counted = decode_kernels(mode.active_sms)
    decode_path = {
        "path": counted["path"],
        "reason": ("the weights take the fused operators: decode runs the fused path's super-operators "
                   "(the per-operator plugins are the fallback after a swap)") if not no_fused else
                  f"decode runs per operator: {no_fused}",
        "operators": registry_ops(path_graph(cfg, schemes, DECODE, decode_path_name)),
        "fused_operators": fused_step_operators(cfg, schemes) if not no_fused else [],
        "kernels_per_token": counted["total"],
        "kernels_per_layer": counted.get("per_layer"),
        "kernels_outside_layers": counted.get("outside_layers"),
        "kernels_by_operator": counted["operators"],
        "glue_kernels": counted["glue"],
        "power_mode": mode.name,
        "label": "predicted: counted from the operators' launch programs at the planned shapes, not profiled",
    }
    for row in roof:
        row["decode_kernels_from"] = f"{counted['path']} decode step"
    return Plan(
        model={"name": cfg.name, **(model_info or {}), "config": cfg.to_dict()},
        target=target.summary(),
        power_mode=mode.name,
        shapes={"buckets": list(shapes.buckets), "context": context, "batch": batch},
        buckets=bucket_info,
        precision=pp,
        decode={
            "splits": splits,
            "block_n": block_n,
            "max_splits": max_splits,
            "programs_per_sm": DECODE_PROGRAMS_PER_SM,
            "rule": f"min(ceil(SMs {target.gpu.sms} x {DECODE_PROGRAMS_PER_SM} / (batch {batch} x KV heads {cfg.n_kv_heads})), "
                    f"ceil(context {context} / BLOCK_N {block_n}), MAX_SPLITS {max_splits})",
            "grid": f"(splits, batch x KV heads) = ({splits}, {batch * cfg.n_kv_heads}): "
                    f"{splits * batch * cfg.n_kv_heads} programs for {target.gpu.sms} SMs",
            "note": "the kernels' launch rule recomputes this on the device from the SM count it reports "
                    "(a power mode that gates SMs may report fewer)",
            "path": decode_path,
        },
        memory=mem,
        tiles=tiles,
        roofline=roof,
        roofline_assumptions=roofline_assumptions(target),
        versions=_versions(),
        notes=notes,
    )
