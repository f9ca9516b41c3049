"""The fused decode paths, described as data: which operators one decode step calls, on which weights, in which order.

The runtime (``edgekit.runtime.fused_decode``) runs a step as described here, the
planner lists the operators of every path the bundle can run (so the build
compiles, signs and ships them like every other operator) and counts their
kernel launches for its predictions, and the runtime reports the source of
each. A new fused or persistent operator is its registry record plus a
``StepCall`` here (and the step code that calls it): nothing else keeps a list.

``weight`` names the model projection (``ModelConfig.linear_shapes`` key, or
"lm_head") whose weight the call takes: it sets the call's shapes for the
launch count and decides whether the float, INT8 (W8A16) or INT4 (W4A16) kernel runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

# The projection operators the fused GEMVs take: float weights, INT8 with a per-channel scale (W8A16), and in the
# layers packed INT4 with group scales (W4A16). The LM head operator (fused_head_argmax) has an INT4 kernel too,
# checked against the FP64 oracle under Triton's CPU interpreter only: the fused path takes INT4 heads once it has
# run on a GPU (until then an INT4 head keeps a model on the per-operator path).
FUSED_WEIGHT_OPS = ("linear", "linear_w8a16", "linear_w4a16")
FUSED_HEAD_WEIGHT_OPS = ("linear", "linear_w8a16")
HEAD = "the LM head"


@dataclass(frozen=True)
class StepCall:
    op: str  # registry name
    weight: str | None = None  # the projection whose weight it multiplies by, None if it takes none


@dataclass(frozen=True)
class DecodeStep:
    """One decode step of a fused path: operator calls per layer and per token, and the torch glue beside them."""

    name: str  # "fused" | "persistent" (what ``run --json`` reports as the path)
    per_layer: tuple[StepCall, ...]
    per_token: tuple[StepCall, ...]
    glue_per_layer: int  # torch kernels between the operators, per layer
    glue_per_token: int
    glue_note: str
    # per-operator entries whose work the step's operators do: a swap of one of them disables the path
    subsumes: tuple[str, ...]
    # per-operator entries the step calls as they are (a swap of one of them disables the path as well)
    shared: tuple[str, ...] = ()

    def operators(self) -> list[str]:
        """Every operator the step calls, in first-call order."""
        seen: dict[str, None] = {}
        for call in self.per_layer + self.per_token:
            seen.setdefault(call.op, None)
        return list(seen)

    def own_operators(self) -> list[str]:
        """The operators only this path calls (its super-operators): the ones a bundle adds for it."""
        return [op for op in self.operators() if op not in self.shared]

    def swap_sensitive(self) -> tuple[str, ...]:
        """Per-operator entries whose replacement the path's operators do not follow (the fallback's trigger)."""
        return self.subsumes + self.shared


FUSED_STEP = DecodeStep(
    name="fused",
    per_layer=(
        StepCall("fused_norm_qkv_rope", "wqkv"),  # RMSNorm -> QKV -> RoPE -> KV-cache write
        StepCall("fused_attn_proj_residual", "wo"),  # split-KV attention, its combine inside o-proj + residual
        StepCall("fused_norm_swiglu", "w_gate_up"),  # RMSNorm -> gate/up -> SwiGLU
        StepCall("fused_proj_residual", "w_down"),  # down projection + residual
    ),
    per_token=(StepCall("fused_head_argmax", "lm_head"),),  # final norm -> LM head -> greedy token on the device
    glue_per_layer=0,
    glue_per_token=2,
    glue_note="per token: the embedding gather and positions + 1 written as int32 (read from FusedDecoder.decode_token)",
    subsumes=("rmsnorm", "qkv_rope", "rope", "attention_decode", "linear", "linear_w8a16", "linear_w4a16", "swiglu"),
)

# Every fused path whose operators a bundle ships, fastest first. The persistent decode kernel
# (runtime/persistent_decode.py) is not a registry operator yet: it runs edgekit's own fused kernels, JIT-compiled.
DECODE_STEPS: tuple[DecodeStep, ...] = (FUSED_STEP,)


def weights_blocker(projection_ops: Mapping[str, str], *, kv_cache: str, gate_up_bias: bool = False) -> str | None:
    """Why the fused operators cannot take these weights (None: they can).

    ``projection_ops`` maps a projection ("layer 3 wqkv", "lm_head", ...) to the operator that runs it.
    """
    for where, op in projection_ops.items():
        if where == HEAD and op not in FUSED_HEAD_WEIGHT_OPS:
            return (f"{where} uses {op}; the fused head operator takes float or W8A16 weights "
                    f"({', '.join(FUSED_HEAD_WEIGHT_OPS)})")
        if op not in FUSED_WEIGHT_OPS:
            return (f"{where} uses {op}; the fused operators take float, W8A16 or W4A16 weights "
                    f"({', '.join(FUSED_WEIGHT_OPS)})")
    if gate_up_bias:
        return "w_gate_up has a bias; the fused gate/up operator takes none"
    if kv_cache != "fp16":
        return f"the fused operators write a plain FP16/BF16 KV cache; this one is {kv_cache}"
    return None


def model_weights_blocker(weights, *, kv_cache: str = "fp16") -> str | None:
    """``weights_blocker`` for a model's weights (``edgekit.model.decoder.ModelWeights``, read by duck typing: this
    module is a leaf)."""
    projections = {f"layer {i} {name}": lw.op for i, b in enumerate(weights.blocks) for name, lw in b.linears().items()}
    projections[HEAD] = weights.lm_head.op
    return weights_blocker(projections, kv_cache=kv_cache,
                           gate_up_bias=any(b.w_gate_up.bias is not None for b in weights.blocks))


def decode_only_operators(steps: Iterable[DecodeStep] = DECODE_STEPS) -> list[str]:
    """The steps' own operators: each runs one token per sequence, so its golden vectors are decode calls."""
    return step_operators(steps, own_only=True)


def step_operators(steps: Iterable[DecodeStep] = DECODE_STEPS, *, own_only: bool = False) -> list[str]:
    """The operators of these steps (only their own ones with ``own_only``), in first-call order, each once."""
    seen: dict[str, None] = {}
    for step in steps:
        for op in (step.own_operators() if own_only else step.operators()):
            seen.setdefault(op, None)
    return list(seen)
