"""The memory plan: does the model fit the target as asked, and if not, what would.

    total memory = weights + KV cache + activations + workspace
                 + runtime reserve (CUDA context, modules, host process)
                 + OS headroom (unified memory only)  + free

Static shapes make every term exact up front: the KV cache is allocated once
for ``batch x context`` (a sliding-window layer's ring for ``batch x window``:
``ModelConfig.kv_cache_bytes``), activations are sized for the largest bucket,
and the workspace for the decode split-K partials. Nothing grows at run time.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgekit.errors import PlanError
from edgekit.model.config import ModelConfig
from edgekit.plan.precision import PrecisionPlan
from edgekit.plan.targets import GIB, Target
from edgekit.units import fmt_bytes

FP16 = 2
FP32 = 4


def activation_bytes(cfg: ModelConfig, batch: int, max_bucket: int) -> int:
    """Peak activations of one prefill of the largest bucket (buffers are reused from layer to layer).

    Counted as if every tensor of one block were live at once (an upper bound):
    residual + normed input (B,T,C), qkv (B,T,Q+2KV), attention output (B,T,Q),
    gate|up (B,T,2F) and the SwiGLU output (B,T,F), all fp16; plus the fp32
    logits of the last position (B,V). Flash attention keeps no (T,T) matrix.
    """
    bt = batch * max_bucket
    per_token = 2 * cfg.hidden_size + (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size + 3 * cfg.intermediate_size
    return bt * per_token * FP16 + batch * cfg.vocab_size * FP32


def workspace_bytes(cfg: ModelConfig, batch: int, context: int, decode_slots: int) -> int:
    """Decode split-K partials and the fp32 RoPE tables (two with a local RoPE base of its own).

    The decode kernel allocates (B, Hq, MAX_SPLITS) slots of an fp32 output row
    plus its log-sum-exp, whatever number of splits a call uses."""
    partials = batch * cfg.n_heads * decode_slots * (cfg.head_dim + 1) * FP32
    tables = 2 if cfg.rope_local_theta is not None and any(cfg.is_local(i) for i in range(cfg.n_layers)) else 1
    rope = tables * 2 * context * (cfg.head_dim // 2) * FP32
    return partials + rope


@dataclass(frozen=True)
class MemoryPlan:
    target_name: str
    total_bytes: int
    weights: int
    kv_cache: int
    activations: int
    workspace: int
    runtime_reserve: int
    os_headroom: int
    # what the numbers were computed for (for messages)
    context: int
    batch: int
    precision_label: str
    kv_precision: str

    @property
    def model_bytes(self) -> int:
        """What the model itself needs (the terms a plan can change)."""
        return self.weights + self.kv_cache + self.activations + self.workspace

    @property
    def available_bytes(self) -> int:
        """Memory left to the model once the OS and the runtime have theirs."""
        return self.total_bytes - self.runtime_reserve - self.os_headroom

    @property
    def free_bytes(self) -> int:
        return self.available_bytes - self.model_bytes

    @property
    def fits(self) -> bool:
        return self.free_bytes >= 0

    def items(self) -> list[tuple[str, int]]:
        """The memory map, in order; with free_bytes it adds up to total_bytes."""
        return [
            ("weights", self.weights),
            ("kv_cache", self.kv_cache),
            ("activations", self.activations),
            ("workspace", self.workspace),
            ("runtime_reserve", self.runtime_reserve),
            ("os_headroom", self.os_headroom),
        ]

    def to_dict(self) -> dict:
        return {
            "target": self.target_name,
            "total_bytes": self.total_bytes,
            **{f"{k}_bytes": v for k, v in self.items()},
            "free_bytes": self.free_bytes,
            "fits": self.fits,
            "context": self.context,
            "batch": self.batch,
            "precision": self.precision_label,
            "kv_precision": self.kv_precision,
            "derived_from": "predicted (computed from shapes; static allocation)",
        }

    @classmethod
    def from_dict(cls, d: dict) -> "MemoryPlan":
        return cls(
            target_name=d["target"], total_bytes=d["total_bytes"], weights=d["weights_bytes"], kv_cache=d["kv_cache_bytes"],
            activations=d["activations_bytes"], workspace=d["workspace_bytes"], runtime_reserve=d["runtime_reserve_bytes"],
            os_headroom=d["os_headroom_bytes"], context=d["context"], batch=d["batch"], precision_label=d["precision"],
            kv_precision=d["kv_precision"],
        )


def plan_memory(
    cfg: ModelConfig, target: Target, precision: PrecisionPlan, *, context: int, batch: int, max_bucket: int, decode_slots: int
) -> MemoryPlan:
    return MemoryPlan(
        target_name=target.name,
        total_bytes=target.memory_bytes,
        weights=sum(precision.weight_bytes(cfg).values()),
        kv_cache=cfg.kv_cache_bytes(context, batch, precision.kv_bytes_per_element),
        activations=activation_bytes(cfg, batch, min(max_bucket, context)),
        workspace=workspace_bytes(cfg, batch, context, decode_slots),
        runtime_reserve=int(target.memory.runtime_reserve_gib * GIB),
        os_headroom=int(target.memory.os_headroom_gib * GIB),
        context=context,
        batch=batch,
        precision_label=precision.label(),
        kv_precision=precision.kv_cache,
    )


# -- what would make it fit --------------------------------------------------------

MIN_CONTEXT = 256


@dataclass(frozen=True)
class FitOption:
    flags: str  # the command-line change, e.g. "--precision int8 --context 4096"
    required_bytes: int  # model bytes with that change


def _shorter_contexts(context: int) -> list[int]:
    """Powers of two below ``context`` down to MIN_CONTEXT, longest first."""
    out, c = [], 1 << (max(context - 1, 1)).bit_length() - 1
    while c >= MIN_CONTEXT:
        if c < context:
            out.append(c)
        c //= 2
    return out


def fit_options(
    cfg: ModelConfig, target: Target, *, scheme: str, kv_precision: str, context: int, batch: int, max_bucket: int,
    decode_slots: int,
) -> list[FitOption]:
    """The smallest changes that make the plan fit, each checked with the same memory model.

    Tried in order of how little they give up: INT8 weights, an INT8 KV cache,
    a smaller batch, a shorter context; then INT8 combined with a smaller batch
    or a shorter context. ``decode_slots`` sizes the decode workspace.
    """

    def required(s: str, kv: str, ctx: int, b: int) -> int:
        pp = PrecisionPlan.uniform(cfg, s, kv)
        return plan_memory(cfg, target, pp, context=ctx, batch=b, max_bucket=min(max_bucket, ctx),
                           decode_slots=decode_slots).model_bytes

    available = target.memory_bytes - int(target.memory.runtime_reserve_gib * GIB) - int(target.memory.os_headroom_gib * GIB)
    options: list[FitOption] = []

    def try_(flags: str, s: str, kv: str, ctx: int, b: int) -> bool:
        need = required(s, kv, ctx, b)
        if need <= available:
            options.append(FitOption(flags.strip(), need))
            return True
        return False

    int8_changes = [("--precision int8", "w8a16", kv_precision)] if scheme == "fp16" else []
    if kv_precision == "fp16":
        int8_changes.append(("--kv-precision int8", scheme, "int8"))
    for flags, s, kv in int8_changes:
        try_(flags, s, kv, context, batch)
    for b in range(batch - 1, 0, -1):  # the largest batch that fits
        if try_(f"--batch {b}", scheme, kv_precision, context, b):
            break
    for c in _shorter_contexts(context):  # the longest context that fits
        if try_(f"--context {c}", scheme, kv_precision, c, batch):
            break
    if not options:
        # Nothing single fits: combine INT8 weights and KV with a smaller batch, then a shorter context.
        both = " ".join(f for f, _, _ in int8_changes)  # every INT8 change not already made
        s8 = "w8a16" if scheme == "fp16" else scheme
        if not (len(int8_changes) > 1 and try_(both, s8, "int8", context, batch)):
            for b in range(batch - 1, 0, -1):
                if try_(f"{both} --batch {b}", s8, "int8", context, b):
                    break
            for c in _shorter_contexts(context):
                if try_(f"{both} --context {c}", s8, "int8", c, batch):
                    break
        if not options:
            for c in _shorter_contexts(context):
                if try_(f"--batch 1 --context {c}", scheme, kv_precision, c, 1):
                    break
            for c in _shorter_contexts(context):
                if try_(f"{both} --batch 1 --context {c}", s8, "int8", c, 1):
                    break
    return options


def misfit_error(cfg: ModelConfig, target: Target, mem: MemoryPlan, options: list[FitOption]) -> PlanError:
    """One line: by how much it misses, where the bytes go, and what would fit."""
    over = -mem.free_bytes
    parts = (
        f"weights {fmt_bytes(mem.weights)} ({mem.precision_label}), "
        f"KV cache {fmt_bytes(mem.kv_cache)} ({mem.kv_precision}, batch {mem.batch} x {mem.context} tokens), "
        f"activations {fmt_bytes(mem.activations)}, workspace {fmt_bytes(mem.workspace)}"
    )
    avail = (
        f"{fmt_bytes(mem.available_bytes)} available of {fmt_bytes(mem.total_bytes)}"
        + (f" after {fmt_bytes(mem.os_headroom)} OS headroom and {fmt_bytes(mem.runtime_reserve)} runtime reserve"
           if mem.os_headroom else f" after {fmt_bytes(mem.runtime_reserve)} runtime reserve")
    )
    msg = f"{cfg.name} does not fit {target.name} (predicted memory plan): needs {fmt_bytes(mem.model_bytes)} ({parts}); {avail}: {fmt_bytes(over)} over"
    if options:
        single = not any(" --" in o.flags for o in options)
        hint = ("would fit: " if single else "no single change fits; these would: ")
        hint += "; ".join(f"{o.flags} (needs {fmt_bytes(o.required_bytes)})" for o in options)
        if any("--kv-precision int8" in o.flags for o in options):
            # plan sizes an INT8 cache, but no bundle holds one yet (build makes FP16 caches; the runtime refuses INT8)
            hint += ". --kv-precision int8 is edgekit plan's sizing only: bundles keep an FP16 KV cache"
    else:
        hint = "nothing fits even with INT8 weights and KV cache, batch 1 and a 256-token context: choose a smaller model or a larger target"
    return PlanError(msg, hint=hint)
