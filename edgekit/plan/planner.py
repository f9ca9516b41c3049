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

import functools
from pathlib import Path
from typing import Callable

from edgekit import __version__
from edgekit.errors import EdgekitError, PlanError
from edgekit.kernels.attention import DECODE_PROGRAMS_PER_SM
from edgekit.kernels.attention import decode_splits as attention_decode_splits
from edgekit.model.config import ModelConfig
from edgekit.plan import buckets as bk
from edgekit.plan.document import (
    BucketChoice, Budgets, DecodePlan, OperatorPlan, Plan, PlannedModel, PlannedShapes, PlannedTarget,
    RooflineAssumptions, Versions,
)
from edgekit.plan.document import DecodePath as DecodePathPlan
from edgekit.plan.memory import MemoryPlan, fit_options, misfit_error, plan_memory
from edgekit.plan.precision import KV_PRECISIONS, PrecisionPlan, scheme_for_cli
from edgekit.plan.roofline import roofline_assumptions, roofline_table
from edgekit.plan.targets import Target
from edgekit.graph.node import DECODE, PREFILL
from edgekit.graph.paths import FUSED, PER_OPERATOR, fused_blocker, fused_step_operators, path_graph, registry_ops
from edgekit.plan.launches import count_pass
from edgekit.plan.tiles import ShapeFacts, TileChoice, kernel_shapes, needed_ops, solve_all
from edgekit.shapes import DEFAULT_MAX_SEQ_LEN, StaticShapes, batch_buckets_for

DEFAULT_DECODE_BLOCK_N = 32  # the smallest decode BLOCK_N: the most splits, before the solver has chosen
DEFAULT_DECODE_MAX_SPLITS = 128  # the largest workspace any decode variant allocates


def decode_splits(
    target: Target, batch: int, n_kv_heads: int, context: int, block_n: int, max_splits: int | None = None,
    programs_per_sm: int = DECODE_PROGRAMS_PER_SM,
) -> int:
    """The decode launch rule's split count (kernels.attention.decode_splits) on ``target``'s SMs."""
    return attention_decode_splits(target.gpu.sms, batch, n_kv_heads, context, block_n, max_splits, programs_per_sm)


def operator_rows(cfg: ModelConfig, pp: PrecisionPlan) -> tuple[OperatorPlan, ...]:
    """plan.json's "operators": every operator the bundle runs (``needed_ops``), each with its precision and the paths
    that call it ("prefill", "decode" (per operator), "fused")."""
    from edgekit.kernels.registry import operator

    schemes = pp.linear_schemes()
    graphs = {"prefill": path_graph(cfg, schemes, PREFILL), "decode": path_graph(cfg, schemes, DECODE)}
    if fused_blocker(cfg, schemes, pp.kv_cache) is None:
        graphs["fused"] = path_graph(cfg, schemes, DECODE, FUSED)
    calls = {name: set(registry_ops(g)) for name, g in graphs.items()}
    rows = []
    for op in needed_ops(cfg, pp):
        p = operator(op).precision
        rows.append(OperatorPlan(op, tuple(name for name, ops in calls.items() if op in ops), p.weights, p.activations,
                                 p.accumulate, p.output))
    return tuple(rows)


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


def _versions() -> Versions:
    try:
        import triton

        tv = triton.__version__
    except Exception:  # triton is optional on hosts that only read plans
        tv = None
    return Versions(__version__, tv)


def check_memory(cfg: ModelConfig, target: Target, precision: str | PrecisionPlan, *, context: int | None, batch: int,
                 kv_precision: str = "fp16", buckets: tuple[int, ...] | None = None) -> MemoryPlan:
    """The memory plan alone (no compile, no roofline): PlanError with what would fit when the model does not."""
    context = checked_context(cfg, context)
    pp = precision if isinstance(precision, PrecisionPlan) else PrecisionPlan.uniform(cfg, scheme_for_cli(precision), kv_precision)
    rows = batch
    max_bucket = max(buckets) if buckets else StaticShapes.for_context(context, batch).buckets[-1]
    mem = plan_memory(cfg, target, pp, context=context, batch=rows, max_bucket=max_bucket,
                      decode_slots=DEFAULT_DECODE_MAX_SPLITS)
    if not mem.fits:
        used = [s for s in pp.schemes_used() if s != "fp16"]
        opts = fit_options(cfg, target, scheme=used[0] if used else "fp16", kv_precision=pp.kv_cache, context=context,
                           batch=rows, max_bucket=max_bucket, decode_slots=DEFAULT_DECODE_MAX_SPLITS)
        raise misfit_error(cfg, target, mem, opts)
    return mem


def checked_context(cfg: ModelConfig, context: int | None) -> int:
    """The KV cache length a command runs at: ``context``, or the default (2048, or the model's positions if fewer);
    refused below 16 or beyond the positions the model was trained for (plan, build and generate say the same)."""
    context = within_positions(cfg, context, DEFAULT_MAX_SEQ_LEN, "context", "--context")
    if context < 16:
        raise PlanError(f"context must be >= 16 tokens, got {context}")
    return context


def within_positions(cfg: ModelConfig, value: int | None, default: int, what: str, flag: str,
                     error: type[EdgekitError] = PlanError) -> int:
    """``value`` (tokens a command runs at, as ``flag`` gave it), or ``default`` lowered to the model's positions
    where it has fewer; a given value beyond the positions the model was trained for is refused (``error``, named
    ``what``). The one rule for plan / build / generate's --context and eval's --window."""
    if value is None:
        return min(default, cfg.max_position_len)
    if value > cfg.max_position_len:
        raise error(f"{what} {value} exceeds what {cfg.name} was trained for ({cfg.max_position_len} positions)",
                    hint=f"use {flag} {cfg.max_position_len} or less")
    return value


def _choose_shapes(
    cfg: ModelConfig, context: int, batch: int, trace_path: Path | str | None, given: tuple[int, ...] | None, max_buckets: int,
) -> tuple[tuple[int, ...], dict]:
    trace = bk.load_trace(trace_path) if trace_path else None
    if given:
        too_long = [b for b in given if b > context]
        if too_long:
            # raising --context past the model's positions is refused in turn: the hint sent the user there
            limit = cfg.max_position_len
            raise PlanError(
                f"buckets {too_long} exceed the context of {context} tokens",
                hint=f"drop them or raise --context to at least {max(too_long)}" if max(too_long) <= limit else
                f"drop those over {limit}: {cfg.name} was trained for {limit} positions, so neither --context nor "
                "a bucket can go past them",
            )
        chosen, method = given, "given"
    elif trace is not None:
        chosen = bk.choose_buckets(trace, context, max_buckets, positions=cfg.max_position_len)
        method = f"optimal for the trace (at most {max_buckets}, DP)"
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
    or the PrecisionPlan quantization decided, per layer (what the build plans with). ``batch`` is the most sequences
    the device decodes together: the KV cache, the memory plan, the tiles and the predictions are sized for it, and
    the device serves the batch buckets below it (``batch_buckets_for``). ``compile_fn(variant)`` overrides how the
    tile solver compiles (the build passes one that uses its cache).
    """
    if batch < 1:
        raise PlanError(f"batch must be >= 1, got {batch}")
    context = checked_context(cfg, context)
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

    chosen, bucket_info = _choose_shapes(cfg, context, batch, trace, buckets, max_buckets)
    shapes = StaticShapes(chosen, context, batch)  # validates the combination

    # Memory first (no compile needed): the workspace is sized for the largest decode variant.
    rows = batch

    def memory(max_splits: int) -> MemoryPlan:
        return plan_memory(cfg, target, pp, context=context, batch=rows, max_bucket=chosen[-1], decode_slots=max_splits)

    mem = memory(DEFAULT_DECODE_MAX_SPLITS)
    if not mem.fits:
        opts = fit_options(cfg, target, scheme=scheme, kv_precision=kv_precision, context=context, batch=rows,
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

    # a target's power modes mostly leave the same SMs on: each SM count is counted once (a pass is ~0.1-1 s)
    @functools.lru_cache(maxsize=None)
    def decode_kernels(sms: int) -> dict:
        """The decode step the bundle will run (the fused path where its weights allow, else per operator), counted."""
        counted = count_pass(cfg, pp, variants, phase=DECODE, path=decode_path_name, batch=batch, tokens=1,
                             context=context, sm_count=sms, max_shared_bytes=smem)
        return {"path": decode_path_name, **counted}

    @functools.lru_cache(maxsize=None)
    def prefill_kernels(sms: int) -> int:
        return count_pass(cfg, pp, variants, phase=PREFILL, path=PER_OPERATOR, batch=batch, tokens=chosen[-1],
                          context=context, sm_count=sms, max_shared_bytes=smem)["total"]

    def kernel_counts(mode) -> tuple[int, int]:
        return decode_kernels(mode.active_sms)["total"], prefill_kernels(mode.active_sms)

    roof = roofline_table(cfg, pp, target, batch=batch, context=context, prefill_bucket=chosen[-1],
                          kernel_counts=kernel_counts)
    counted = decode_kernels(mode.active_sms)  # read only below: the cached dict itself
    decode_path = DecodePathPlan(
        path=counted["path"],
        reason=("the weights take the fused operators: decode runs the fused path's super-operators "
                "(the per-operator plugins are the fallback after a swap)") if not no_fused else
               f"decode runs per operator: {no_fused}",
        operators=tuple(registry_ops(path_graph(cfg, schemes, DECODE, decode_path_name))),
        fused_operators=tuple(fused_step_operators(cfg, schemes)) if not no_fused else (),
        kernels_per_token=counted["total"], kernels_per_layer=counted.get("per_layer"),
        kernels_outside_layers=counted.get("outside_layers"), kernels_by_operator=counted["operators"],
        glue_kernels=counted["glue"], power_mode=mode.name,
        label="predicted: counted from the operators' launch programs at the planned shapes, not profiled",
    )
    for row in roof:
        row["decode_kernels_from"] = f"{counted['path']} decode step"
    w = target.watchdog
    return Plan(
        model=PlannedModel(cfg.name, cfg.to_dict(), (model_info or {}).get("source")),
        target=PlannedTarget.of(target),
        power_mode=mode.name,
        shapes=PlannedShapes(tuple(shapes.buckets), context, batch, batch_buckets_for(batch)),
        buckets=BucketChoice(**bucket_info),
        budgets=Budgets(w.jitter_budget_ms, w.power_band_w, w.temperature_warn_c, w.temperature_limit_c),
        precision=pp,
        operators=operator_rows(cfg, pp),
        decode=DecodePlan(
            splits=splits, block_n=block_n, max_splits=max_splits, programs_per_sm=DECODE_PROGRAMS_PER_SM,
            rule=f"min(ceil(SMs {target.gpu.sms} x {DECODE_PROGRAMS_PER_SM} / (batch {batch} x KV heads {cfg.n_kv_heads})), "
                 f"ceil(context {context} / BLOCK_N {block_n}), MAX_SPLITS {max_splits})",
            grid=f"(splits, batch x KV heads) = ({splits}, {batch * cfg.n_kv_heads}): "
                 f"{splits * batch * cfg.n_kv_heads} programs for {target.gpu.sms} SMs",
            note="the kernels' launch rule recomputes this on the device from the SM count it reports "
                 "(a power mode that gates SMs may report fewer)",
            path=decode_path,
        ),
        memory=mem,
        tiles=tuple(tiles),
        roofline=tuple(roof),
        roofline_assumptions=RooflineAssumptions(**roofline_assumptions(target)),
        versions=_versions(),
        notes=tuple(notes),
    )
