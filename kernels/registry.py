"""Every operator edgekit knows: its spec and its torch reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from edgekit.kernels import attention, linear, rmsnorm, rope, swiglu
from edgekit.kernels import fused_head_argmax, fused_norm_qkv_rope, fused_norm_swiglu, fused_proj_residual
from edgekit.kernels.spec import OpSpec


@dataclass(frozen=True)
class Operator:
    spec: OpSpec
    reference: Callable


OPERATORS: dict[str, Operator] = {
    op.spec.name: op
    for op in (
        Operator(rmsnorm.SPEC, rmsnorm.rmsnorm_reference),
        Operator(rope.ROPE_SPEC, rope.rope_reference),
        Operator(rope.QKV_ROPE_SPEC, rope.qkv_rope_reference),
        Operator(attention.PREFILL_SPEC, attention.attention_prefill_reference),
        Operator(attention.DECODE_SPEC, attention.attention_decode_reference),
        Operator(linear.LINEAR_SPEC, linear.linear_reference),
        Operator(linear.W8A16_SPEC, linear.linear_w8a16_reference),
        Operator(linear.W8A8_SPEC, linear.linear_w8a8_reference),
        Operator(swiglu.SPEC, swiglu.swiglu_reference),
        # fused decode super-operators (edgekit/runtime/fused_decode.py runs them)
        Operator(fused_norm_qkv_rope.SPEC, fused_norm_qkv_rope.fused_norm_qkv_rope_reference),
        Operator(fused_proj_residual.SPEC, fused_proj_residual.fused_proj_residual_reference),
        Operator(fused_norm_swiglu.SPEC, fused_norm_swiglu.fused_norm_swiglu_reference),
        Operator(fused_head_argmax.SPEC, fused_head_argmax.fused_head_argmax_reference),
    )
}
