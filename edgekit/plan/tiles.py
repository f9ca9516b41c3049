"""The tile solver: for every kernel the plan needs, a variant that fits the target's shared memory,
proved by compiling it for the target's arch.

For a kernel that stages tiles in shared memory:

1. enumerate its candidates (``kernels.variants.tile_space``: block sizes, warps, stages);
2. keep those whose analytical estimate fits the per-block budget;
3. rank them, in this order (each rule breaks the ties of the one before):
   a. the grid fills the target (at least one program per SM; for split-KV
      decode, the programs the launch rule asks for) at the planned shape;
   b. the largest tile (product of the BLOCK_* sizes): more reuse per byte loaded;
   c. the deepest pipeline (num_stages): more loads in flight;
   d. the most blocks per SM that shared memory allows: more latency hiding;
   e. decode only: the smallest MAX_SPLITS that still holds the planned splits (less workspace);
   f. the kernel's default warp count, then fewer warps; then the smaller estimate;
   The split-KV decode attention kernels (``SPLIT_KV_KERNELS``) rank by ``split_kv_rank_key`` instead:
   a. the key block of the kernel's default (``attention_triton._decode_default``: the longest, at most 128, whose
      three stages fit; the nearest where it does not fit) and its merge step (SPLIT_STEP);
   b. the fewest waves: the planned programs over the SMs times the blocks an SM holds (by shared memory, threads
      and the block limit): every program of a wave loads as many keys, so a second wave is a second load time;
   c. the deepest pipeline; then rules e and f.
   Measured (H100, tools/step_ab.py --sms 16,8,0, depth 512 and 4096, smollm2-135m and llama-3.2-1b, 2026-12-07):
   the largest tile (256 keys) and the 2-split merge step that rule b and the label order gave lost 2-22% to the
   default's 128 keys and 8-split step at every SM count; 64 or 32 keys never won by more than 0.5%; fewer stages
   won only where the programs outnumber what one wave holds (smollm2-135m at depth 4096 on 8 and 16 SMs: 2 stages
   +4-5% over 3), and deeper ones where one wave holds them all.
4. compile the best for the target's arch (``kernels.aot.compile_variant``)
   and read its real shared bytes and ptxas register/spill report; if the
   compiled bytes exceed the budget or its registers do not fit an SM, drop
   it and compile the next, up to ``MAX_COMPILES``. A variant that spills
   registers is passed over too; if no spill-free one turns up, the kernel's
   default variant is compiled (the best-ranked tiles may all be register-bound:
   INT4 GEMM tiles of 128 x 64 x 128 in 4 stages); only if that one spills too
   (or does not fit) does the best spilling candidate stand.

A kernel that does not tile through shared memory (GEMV, reductions,
elementwise) takes its default variant, compiled the same way, so every
shared-memory figure in a plan is one a compiler reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterable, Mapping

from edgekit.errors import EdgekitError, PlanError
from edgekit.kernels.attention import DECODE_PROGRAMS_PER_SM, SPLIT_KV_KERNELS, decode_splits, decode_waves
from edgekit.graph.builder import LinearSchemes
from edgekit.graph.node import DECODE as DECODE_PHASE
from edgekit.graph.node import PROJ
from edgekit.graph.paths import FUSED, bundle_operators, path_graph
from edgekit.kernels.operator import DECODE, PREFILL, PlannedShape
from edgekit.kernels.registry import operator, operator_for_scheme
from edgekit.model.config import ModelConfig
from edgekit.plan.precision import PrecisionPlan
from edgekit.plan.targets import Target

MAX_COMPILES = 8  # per kernel: candidates compiled before giving up (each ~0.3-2 s on a CPU)
TILE_DIMS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "BLOCK_H")  # BLOCK_G is set by the model's GQA ratio, not chosen


@dataclass(frozen=True)
class Rejection:
    variant: str  # label
    estimated_bytes: int
    compiled_bytes: int | None
    reason: str

    def to_dict(self) -> dict:
        return {"variant": self.variant, "estimated_bytes": self.estimated_bytes, "compiled_bytes": self.compiled_bytes,
                "reason": self.reason}


@dataclass
class TileChoice:
    op: str
    kernel: str
    variant: Any  # kernels.variants.KernelVariant
    arch: str
    budget_bytes: int
    estimated_shared_bytes: int
    shared_bytes: int  # from the compiled kernel, never estimated
    compiled_name: str
    triton_version: str
    registers: int | None
    spill_bytes: int | None
    searched: bool  # False: a kernel whose tile is not searched under the budget (its default variant)
    shape: dict  # the shape facts it was solved for
    programs: int | None = None  # grid size at that shape
    programs_target: int | None = None
    candidates: int = 0
    within_estimate: int = 0
    rejected: list[Rejection] = field(default_factory=list)
    reason: str = ""
    # the compiled kernel this choice was confirmed with (not serialized): the build ships it, compiling nothing twice
    compiled: Any = field(default=None, compare=False, repr=False)

    @property
    def constexprs(self) -> dict:
        return dict(self.variant.constexprs)

    def to_dict(self) -> dict:
        v = self.variant
        return {
            "op": self.op,
            "kernel": self.kernel,
            "variant": v.to_dict(),
            "constexprs": dict(v.constexprs),
            "num_warps": v.num_warps,
            "num_stages": v.num_stages,
            "dtype": v.dtype,
            "arch": self.arch,
            "budget_bytes": self.budget_bytes,
            "shared_bytes": self.shared_bytes,
            "shared_bytes_source": f"compiled for {self.arch} by triton {self.triton_version} (kernel metadata)",
            "estimated_shared_bytes": self.estimated_shared_bytes,
            "compiled_name": self.compiled_name,
            "registers": self.registers,
            "spill_bytes": self.spill_bytes,
            "searched": self.searched,
            "shape": self.shape,
            "programs": self.programs,
            "programs_target": self.programs_target,
            "candidates": self.candidates,
            "within_estimate": self.within_estimate,
            "rejected": [r.to_dict() for r in self.rejected],
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "TileChoice":
        """A choice read back from a plan document (``compiled`` is None: the build compiles it)."""
        from edgekit.kernels.variants import KernelVariant

        try:
            triton_version = d["shared_bytes_source"].split(" by triton ", 1)[1].split(" ", 1)[0]
            return cls(
                op=d["op"], kernel=d["kernel"], variant=KernelVariant.from_dict(d["variant"]), arch=d["arch"],
                budget_bytes=int(d["budget_bytes"]), estimated_shared_bytes=int(d["estimated_shared_bytes"]),
                shared_bytes=int(d["shared_bytes"]), compiled_name=d["compiled_name"], triton_version=triton_version,
                registers=d["registers"], spill_bytes=d["spill_bytes"], searched=bool(d["searched"]), shape=dict(d["shape"]),
                programs=d["programs"], programs_target=d["programs_target"], candidates=int(d["candidates"]),
                within_estimate=int(d["within_estimate"]),
                rejected=[Rejection(r["variant"], r["estimated_bytes"], r["compiled_bytes"], r["reason"]) for r in d["rejected"]],
                reason=d["reason"],
            )
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise PlanError(f"invalid tile choice in plan: {type(e).__name__}: {e} (in {str(d)[:200]})",
                            hint="re-plan with this edgekit version") from e


# -- the solver core (pure: candidates in, choice out) ---------------------------------



# Split-KV decode attention kernels (kernels.attention.SPLIT_KV_KERNELS): the planner sizes their split count, and
# every other kernel of the operator reads their workspace, so it takes the same values of these constexprs (the
# operators' launch programs refuse a mismatch).
SPLIT_SHARED_CONSTEXPRS = ("HEAD_DIM", "MAX_SPLITS")


def _agrees_with_split(constexprs: Mapping, split: Mapping | None) -> bool:
    return split is None or all(constexprs[k] == split[k] for k in SPLIT_SHARED_CONSTEXPRS if k in constexprs and k in split)

def tile_work(v) -> int:
    return math.prod(v.constexprs[d] for d in TILE_DIMS if d in v.constexprs)


def rank_key(v, est: int, *, per_sm_bytes: int, programs: Callable | None, programs_target: int | None,
             default_warps: int | None, want_splits: int | None):
    """Sort key for candidates within the estimate budget: smaller is better (see the module doc, rule 3)."""
    fills = 0
    if programs is not None and programs_target:
        fills = 0 if programs(v) >= programs_target else 1
    blocks_per_sm = per_sm_bytes // max(est, 1)
    return (fills, -tile_work(v), -v.num_stages, -blocks_per_sm) + _last_rules(v, est, default_warps, want_splits)


def _last_rules(v, est: int, default_warps: int | None, want_splits: int | None) -> tuple:
    """Rules e and f (module doc), the last ties of both sort keys."""
    splits_waste = 0
    if want_splits is not None and "MAX_SPLITS" in v.constexprs:
        ms = v.constexprs["MAX_SPLITS"]
        splits_waste = (0, ms) if ms >= want_splits else (1, -ms)  # hold the splits, else the most it can
    warps_pref = (0 if v.num_warps == default_warps else 1, v.num_warps)
    return (splits_waste, warps_pref, est, v.label())


def resident_blocks(v, est: int, *, per_sm_bytes: int, max_threads_per_sm: int | None, max_blocks_per_sm: int | None) -> int:
    """Blocks of ``v`` one SM holds at once: by shared memory (the estimate), threads and the block limit (registers
    are known only once compiled)."""
    n = per_sm_bytes // max(est, 1)
    if max_threads_per_sm:
        n = min(n, max_threads_per_sm // (v.num_warps * 32))
    if max_blocks_per_sm:
        n = min(n, max_blocks_per_sm)
    return max(n, 0)


def split_kv_rank_key(v, est: int, *, default, n_waves: float, want_splits: int, default_warps: int | None):
    """Sort key of a split-KV decode kernel's candidates (module doc, rule 3, its split-KV paragraph): smaller is
    better. ``n_waves``: the waves its planned programs take (``decode_waves``)."""
    block_n, default_n = v.constexprs["BLOCK_N"], default.constexprs["BLOCK_N"]
    key_block = (abs(math.log2(block_n / default_n)), -block_n)  # the default's, else the nearest (the longer first)
    merge = v.constexprs.get("SPLIT_STEP") != default.constexprs.get("SPLIT_STEP")
    return (key_block, merge, n_waves, -v.num_stages) + _last_rules(v, est, default_warps, want_splits)


def solve_kernel(
    candidates: Iterable,
    *,
    budget_bytes: int,
    per_sm_bytes: int,
    arch: str,
    estimate: Callable[[Any], int],
    compile_fn: Callable[[Any], Any],
    registers_per_sm: int = 65536,
    programs: Callable[[Any], int] | None = None,
    programs_target: int | None = None,
    default_warps: int | None = None,
    want_splits: int | None = None,
    max_compiles: int = MAX_COMPILES,
    shape: dict | None = None,
    default=None,
    sms: int | None = None,
    max_threads_per_sm: int | None = None,
    max_blocks_per_sm: int | None = None,
) -> TileChoice:
    """The best candidate whose compiled shared bytes fit ``budget_bytes``; PlanError when none does. ``default``:
    the kernel's default variant, compiled when every candidate compiled fits but spills. A split-KV decode kernel
    (``want_splits`` given, with ``programs``, ``sms`` and ``default``) ranks by ``split_kv_rank_key``.

    ``compile_fn(v)`` returns an object with ``shared_bytes``, ``name``, ``triton_version``,
    ``registers`` and ``spills`` (kernels.aot.CompiledKernel) or raises an EdgekitError.
    """
    cands = list(candidates)
    if not cands:
        raise PlanError("no candidate variants to choose from (an empty tile space)")
    op, kernel = cands[0].op, cands[0].kernel
    scored = [(v, estimate(v)) for v in cands]
    fitting = [(v, e) for v, e in scored if e <= budget_bytes]
    split_kv = want_splits is not None and programs is not None and bool(sms) and default is not None

    def held(v, est: int) -> int:  # programs of ``v`` the SMs hold at once
        return sms * resident_blocks(v, est, per_sm_bytes=per_sm_bytes, max_threads_per_sm=max_threads_per_sm,
                                     max_blocks_per_sm=max_blocks_per_sm)

    def key(ve):
        v, est = ve
        if split_kv:
            return split_kv_rank_key(v, est, default=default, n_waves=decode_waves(programs(v), held(v, est)),
                                     want_splits=want_splits, default_warps=default_warps)
        return rank_key(v, est, per_sm_bytes=per_sm_bytes, programs=programs, programs_target=programs_target,
                        default_warps=default_warps, want_splits=want_splits)

    fitting.sort(key=key)
    rejected: list[Rejection] = []
    spilling: tuple | None = None  # the best candidate that fits but spills: taken only if nothing better compiles

    def choice(rank: int, v, est: int, ck, spill: int | None, note: str = "") -> TileChoice:
        n_prog = programs(v) if programs is not None else None
        why = [f"rank {rank} of {len(fitting)} within the estimate budget"]
        if n_prog is not None and programs_target:
            why.append(f"{n_prog} programs {'>=' if n_prog >= programs_target else '<'} {programs_target} wanted")
        why.append(f"tile {tile_work(v)}, {v.num_stages} stages, {per_sm_bytes // max(ck.shared_bytes, 1)} blocks/SM by smem")
        if split_kv and n_prog is not None:
            h = held(v, est)
            why.append(f"{n_prog} programs in {decode_waves(n_prog, h) if h else 'no'} wave(s) of {h}")
        if note:
            why.append(note)
        return TileChoice(
            op=op, kernel=kernel, variant=v, arch=arch, budget_bytes=budget_bytes, estimated_shared_bytes=est,
            shared_bytes=int(ck.shared_bytes), compiled_name=ck.name, triton_version=str(ck.triton_version),
            registers=ck.registers, spill_bytes=spill, searched=True, shape=dict(shape or {}), programs=n_prog,
            programs_target=programs_target, candidates=len(cands), within_estimate=len(fitting), rejected=rejected,
            reason="; ".join(why), compiled=ck,
        )

    def confirmed(v, est: int):
        """(compiled kernel, spilled bytes) of a candidate that fits the budget and the SM's registers, else None
        (its rejection recorded)."""
        try:
            ck = compile_fn(v)
        except EdgekitError as e:  # over budget once compiled, or Triton could not compile it
            rejected.append(Rejection(v.label(), est, getattr(e, "compiled_bytes", None), e.message))
            return None
        spill = None if ck.spills is None else int(ck.spills.get("stores", 0)) + int(ck.spills.get("loads", 0))
        threads = v.num_warps * 32
        if ck.shared_bytes > budget_bytes:
            rejected.append(Rejection(v.label(), est, ck.shared_bytes, f"compiled {ck.shared_bytes} B > budget {budget_bytes} B"))
            return None
        if ck.registers is not None and ck.registers * threads > registers_per_sm:
            rejected.append(Rejection(v.label(), est, ck.shared_bytes,
                                      f"{ck.registers} registers x {threads} threads exceed the SM's {registers_per_sm}"))
            return None
        if spill:
            rejected.append(Rejection(v.label(), est, ck.shared_bytes, f"spills {spill} B of registers to local memory"))
        return ck, spill

    for rank, (v, est) in enumerate(fitting[:max_compiles], 1):
        got = confirmed(v, est)
        if got is None:
            continue
        ck, spill = got
        if spill:
            if spilling is None:
                spilling = (rank, v, est, ck, spill)
            continue
        return choice(rank, v, est, ck, spill)
    compiled = {v.label() for v, _ in fitting[:max_compiles]}
    if spilling is not None and default is not None and default.label() not in compiled:
        ranks = {v.label(): rank for rank, (v, _) in enumerate(fitting, 1)}
        est = estimate(default)
        got = confirmed(default, est) if default.label() in ranks else None
        if got is not None and not got[1]:
            note = f"the kernel's default variant: the {len(compiled)} best-ranked candidates compiled fit but spill"
            return choice(ranks[default.label()], default, est, got[0], got[1], note=note)
    if spilling is not None:
        rank, v, est, ck, spill = spilling
        rejected[:] = [r for r in rejected if r.variant != v.label()]
        return choice(rank, v, est, ck, spill,
                      note=f"spills {spill} B: no spill-free candidate among the {max_compiles} compiled, nor the default")
    tried = "; ".join(f"{r.variant}: {r.reason}" for r in rejected[:3])
    smallest = min(e for _, e in scored)
    raise PlanError(
        f"no variant of {op}/{kernel} fits {budget_bytes} B of shared memory on {arch}: {len(cands)} candidates, "
        f"{len(fitting)} within the estimate (smallest estimate {smallest} B), {len(rejected)} compiled and rejected"
        + (f" ({tried})" if tried else ""),
        hint="raise the target's per_block_budget_bytes if the hardware allows, or add smaller tiles to the kernel's tile space",
    )


def confirm_default(v, *, budget_bytes: int, arch: str, estimate: Callable, compile_fn: Callable, shape: dict) -> TileChoice:
    """A kernel without shared-memory tiles: its default variant, compiled so its real bytes are on record."""
    try:
        ck = compile_fn(v)
    except EdgekitError as e:
        raise PlanError(f"{v.op}/{v.kernel}: its default variant {v.label()} does not build for {arch}: {e.message}") from e
    if ck.shared_bytes > budget_bytes:
        raise PlanError(f"{v.op}/{v.kernel}: default variant {v.label()} needs {ck.shared_bytes} B of shared memory "
                        f"on {arch}, over the {budget_bytes} B budget")
    spill = None if ck.spills is None else int(ck.spills.get("stores", 0)) + int(ck.spills.get("loads", 0))
    return TileChoice(
        op=v.op, kernel=v.kernel, variant=v, arch=arch, budget_bytes=budget_bytes, estimated_shared_bytes=estimate(v),
        shared_bytes=int(ck.shared_bytes), compiled_name=ck.name, triton_version=str(ck.triton_version),
        registers=ck.registers, spill_bytes=spill, searched=False, shape=dict(shape), candidates=1, within_estimate=1,
        reason="default variant (no tile search under the shared-memory budget), compiled to record its real bytes",
        compiled=ck,
    )


# -- what the model needs, and at which shapes -------------------------------------------


def needed_ops(cfg: ModelConfig, precision: PrecisionPlan) -> list[str]:
    """Operators a bundle of this precision runs on every path it can take, read from the model's graph
    (``graph.paths.bundle_operators``): what the plan lists and the build compiles."""
    return bundle_operators(cfg, precision.linear_schemes(), precision.kv_cache)


@dataclass(frozen=True)
class ShapeFacts:
    """The static shapes the kernels run at, from the model and the plan."""

    cfg: ModelConfig
    batch: int
    max_bucket: int
    context: int
    precision: PrecisionPlan

    @property
    def prefill_rows(self) -> int:
        return self.batch * self.max_bucket

    def base(self) -> dict:
        c = self.cfg
        return {"head_dim": c.head_dim, "n_heads": c.n_heads, "n_kv_heads": c.n_kv_heads, "hidden_size": c.hidden_size}

    def min_out_features(self, op: str) -> int:
        """The narrowest projection (fewest output columns) run by a linear op: its grid is the smallest."""
        shapes = self.cfg.linear_shapes()
        outs = [shapes[p][0] for layer in self.precision.layers for p, s in layer.items()
                if operator_for_scheme(s).name == op]
        if op == "linear":
            outs.append(self.cfg.vocab_size)
        return min(outs) if outs else self.cfg.hidden_size


def gemv_max_rows() -> int:
    """Rows up to which the linear ops launch their GEMV kernel (the kernels' launch rule)."""
    from edgekit.kernels.linear_triton import GEMV_MAX_ROWS

    return GEMV_MAX_ROWS


def step_weight_shape(op: str, cfg: ModelConfig, precision: PrecisionPlan | None = None) -> dict:
    """{"n_out", "k_in"} of the largest projection ``op`` multiplies by in the fused decode graph (the one that takes
    longest: its tiles are chosen for it, and the same kernel runs the smaller ones); {} for an operator that takes
    no projection there."""
    schemes = precision.linear_schemes() if precision is not None else LinearSchemes.uniform(cfg.n_layers)
    shapes = {**cfg.linear_shapes(), "lm_head": (cfg.vocab_size, cfg.hidden_size)}
    weights = [shapes[n.weights[PROJ].rsplit(".", 1)[-1]] for n in path_graph(cfg, schemes, DECODE_PHASE, FUSED).nodes
               if n.op == op and PROJ in n.weights]
    if not weights:
        return {}
    n, k = max(weights, key=lambda nk: nk[0] * nk[1])
    return {"n_out": n, "k_in": k}


def kernel_shapes(op: str, facts: ShapeFacts) -> dict[str, dict]:
    """kernel -> the shape facts it is solved at: the operator's decode kernels at the decode rows (the batch),
    its prefill kernels at the largest bucket (``Operator.tiles_at``)."""
    base = {**facts.base(), **step_weight_shape(op, facts.cfg, facts.precision)}
    at = {DECODE: {**base, "rows": facts.batch}, PREFILL: {**base, "rows": facts.prefill_rows}}
    record = operator(op)
    kernels = {kernel: at[role] for kernel, role in record.tiles_at.items()}
    only_last_token = record.scheme == "fp16" and not any(s == "fp16" for layer in facts.precision.layers for s in layer.values())
    if only_last_token and facts.batch <= gemv_max_rows():
        # only the LM head runs this operator, on the last token: its decode kernels only
        kernels = {kernel: shape for kernel, shape in kernels.items() if record.tiles_at[kernel] == DECODE}
    return kernels


def planned_shape(facts: ShapeFacts, target: Target, want_splits: int) -> PlannedShape:
    c = facts.cfg
    return PlannedShape(
        cfg=c, batch=facts.batch, max_bucket=facts.max_bucket, context=facts.context, sms=target.gpu.sms,
        want_splits=want_splits, out_features=facts.min_out_features,
        decode_splits=lambda block_n, max_splits: decode_splits(target.gpu.sms, facts.batch, c.n_kv_heads, facts.context,
                                                                block_n, max_splits),
    )


def solve_all(
    cfg: ModelConfig,
    target: Target,
    precision: PrecisionPlan,
    *,
    batch: int,
    buckets: tuple[int, ...],
    context: int | None = None,
    dtype: str = "fp16",
    progress: Callable[[str], None] | None = None,
    compile_fn: Callable | None = None,
    ops: Collection[str] | None = None,
) -> list[TileChoice]:
    """A confirmed variant for every kernel of every operator the plan needs (of ``ops`` only, where given: one
    operator's tiles, e.g. the decode attention's, without compiling the others)."""
    from edgekit.kernels import variants as kv
    from edgekit.kernels.aot import compile_variant

    budget = target.smem_budget_bytes
    arch_num = target.gpu.compute_capability
    if compile_fn is None:
        from edgekit.cache import BuildCache

        store = BuildCache(None)  # the default on-disk cache: replanning the same model compiles nothing again

        def compile_fn(v):
            return compile_variant(v, arch_num, budget_bytes=budget, store=store)

    facts = ShapeFacts(cfg, batch, buckets[-1], context or buckets[-1], precision)
    want_splits = math.ceil(target.gpu.sms * DECODE_PROGRAMS_PER_SM / (batch * cfg.n_kv_heads))
    smem_ops = set(kv.shared_memory_ops())
    choices: list[TileChoice] = []
    for op in needed_ops(cfg, precision):
        if ops is not None and op not in ops:
            continue
        if op not in kv.op_kernels():
            continue  # no Triton kernels for it (yet): the build uses the torch reference
        chosen: dict[str, TileChoice] = {}
        for kernel, shape in kernel_shapes(op, facts).items():
            kdef = kv.kernel_def(op, kernel)
            # kernels that read a split-KV kernel's workspace must agree with it on these (the programs check it)
            partner = next((c.variant.constexprs for k, c in chosen.items() if k in SPLIT_KV_KERNELS), None)
            space = [v for v in kv.tile_space(op, dtype=dtype, **shape)
                     if v.kernel == kernel and _agrees_with_split(v.constexprs, partner)]
            # a kernel reading the split kernel's workspace: its default at that split count (the reduce's warps
            # grow with the partial rows it holds)
            split = {"max_splits": partner["MAX_SPLITS"]} if partner and "MAX_SPLITS" in partner else {}
            defaults = kv.default_variants(op, dtype=dtype, **shape, **split)
            if progress:
                progress(f"{op}/{kernel}: {len(space)} candidates, compiling for {target.arch}")
            if kdef.uses_shared_memory and op in smem_ops and space:
                grid, wanted = operator(op).grid(kernel, planned_shape(facts, target, want_splits))
                choice = solve_kernel(
                    space, budget_bytes=budget, per_sm_bytes=target.gpu.shared_memory.per_sm_bytes, arch=target.arch,
                    estimate=kv.estimate_shared_bytes, compile_fn=compile_fn, registers_per_sm=target.gpu.registers_per_sm,
                    programs=grid, programs_target=wanted, default_warps=defaults[kernel].num_warps,
                    want_splits=want_splits if kernel in SPLIT_KV_KERNELS else None, shape=shape,
                    default=defaults[kernel], sms=target.gpu.sms, max_threads_per_sm=target.gpu.max_threads_per_sm,
                    max_blocks_per_sm=target.gpu.max_blocks_per_sm,
                )
            else:
                v = defaults[kernel]
                if partner is not None:
                    shared = {k: partner[k] for k in SPLIT_SHARED_CONSTEXPRS if k in v.constexprs and k in partner}
                    v = type(v)(v.op, v.kernel, {**v.constexprs, **shared}, v.num_warps, v.num_stages, v.dtype)
                choice = confirm_default(v, budget_bytes=budget, arch=target.arch, estimate=kv.estimate_shared_bytes,
                                         compile_fn=compile_fn, shape=shape)
            chosen[kernel] = choice
        choices.extend(chosen.values())
    return choices
