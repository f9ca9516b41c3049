"""Fused decode operator: split-KV decode attention -> combine -> output projection, without the residual add.

``fused_attn_proj_residual`` for the families that put a norm between the
attention's output projection and the residual add (Gemma 3's post-attention
RMSNorm): the same two launches (the split-KV attention, whose last split of a
KV head merges the head's splits, then the output GEMV), the projection's
output returned as is. ``arrivals`` is the same caller-kept workspace of zeros
(``@split_arrivals``), left at zero.
"""

from __future__ import annotations

import torch

from edgekit.kernels.attention import DECODE_SPEC, attention_decode_reference, decode_grid
from edgekit.kernels.fused_attn_proj_residual import _shape, prepare_attn_proj
from edgekit.kernels.fused_attn_proj_residual import golden_inputs as _with_residual_golden_inputs
from edgekit.kernels.fused_decode_common import FLOAT_DTYPES, FUSED_SCHEMES, fused_precision, project, weight_inputs
from edgekit.kernels.fusion import Fusion
from edgekit.kernels.operator import DECODE, Operator
from edgekit.kernels.spec import REDUCTION_TOLERANCE, OpSpec, TensorSpec

SPEC = OpSpec(
    name="fused_attn_proj",
    abi_version=1,
    inputs=(
        *DECODE_SPEC.inputs,  # q, k_cache, v_cache, seq_lens: attention_decode's
        TensorSpec("arrivals", "(B, Hkv)", ("int32",)),
        *weight_inputs("N", "Hq * D"),
    ),
    outputs=(TensorSpec("y", "(B, N)", FLOAT_DTYPES),),
    attributes=("sm_scale",),
    tolerance=REDUCTION_TOLERANCE,
    doc="y = attention_decode(q, k_cache, v_cache, seq_lens).reshape(B, Hq*D) @ W.T (+ bias); attention output "
        "rounded to the activation dtype as the per-operator path.",
)


def fused_attn_proj_reference(q, k_cache, v_cache, seq_lens, arrivals, weight, scale, offset, bias,
                              sm_scale: float | None = None) -> torch.Tensor:
    """``arrivals`` is the kernels' workspace: the reference needs none (and leaves it, zero, as the kernels do)."""
    o = attention_decode_reference(q, k_cache, v_cache, seq_lens, sm_scale)  # (B, Hq, D)
    return project(o.reshape(q.shape[0], -1), weight, scale, bias, offset)


def golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    """fused_attn_proj_residual's golden call without its residual."""
    inputs, attrs = _with_residual_golden_inputs(cfg, rows, context, g)
    del inputs["residual"]
    return inputs, attrs


def prepare(q, k_cache, v_cache, seq_lens, arrivals, weight, scale, offset, bias, sm_scale=None):
    return prepare_attn_proj(SPEC.name, q, k_cache, v_cache, seq_lens, arrivals, weight, scale, offset, bias, None,
                             sm_scale)


# decode attention over the written cache -> heads as a row -> output projection (a norm follows, not the residual)
FUSION = Fusion(
    pattern=("attention_decode", "merge_heads", "linear"),
    inputs={"q": "0.q", "k_cache": "@k_cache", "v_cache": "@v_cache", "seq_lens": "0.seq_lens",
            "arrivals": "@split_arrivals", "proj": "2.proj"},
    attributes={"sm_scale": "0.scale"},
    outputs={"y": "2.y"},
    schemes=FUSED_SCHEMES,
)

OPERATORS = (
    Operator(SPEC, fused_attn_proj_reference, fused_precision(SPEC.name), golden_inputs, call_shape=_shape,
             triton="fused_attn_proj_triton:OP", prepare=prepare,
             tiles_at={"attn_split_combine": DECODE, "attn_o_proj_fp": DECODE, "attn_o_proj_w8": DECODE,
                       "attn_o_proj_w4": DECODE}, grid=decode_grid, fusion=FUSION),
)
