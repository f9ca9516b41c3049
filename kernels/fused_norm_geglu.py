"""Fused decode operator: RMSNorm -> packed gate/up projection -> GeGLU (Gemma's MLP input: gelu_tanh(gate) * up)."""

from __future__ import annotations

import torch

from edgekit.kernels.fused_decode_common import (
    FLOAT_DTYPES, FUSED_SCHEMES, fused_precision, project, weight_inputs, weight_shape,
)
from edgekit.kernels.fused_norm_swiglu import gate_up_prepare, golden_inputs
from edgekit.kernels.fusion import Fusion
from edgekit.kernels.geglu import geglu_reference
from edgekit.kernels.operator import DECODE, Operator
from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.kernels.spec import REDUCTION_TOLERANCE, OpSpec, TensorSpec

SPEC = OpSpec(
    name="fused_norm_geglu",
    abi_version=1,
    inputs=(TensorSpec("x", "(B, C)", FLOAT_DTYPES), TensorSpec("norm_weight", "(C,)", FLOAT_DTYPES),
            *weight_inputs("2F", "C", bias=False)),
    outputs=(TensorSpec("y", "(B, F)", FLOAT_DTYPES),),
    attributes=("eps",),
    tolerance=REDUCTION_TOLERANCE,
    doc="y = gelu_tanh(g) * u with [g | u] = rmsnorm(x) @ W.T; W packs the gate rows then the up rows.",
)


def fused_norm_geglu_reference(x, norm_weight, weight, scale, offset, eps: float) -> torch.Tensor:
    return geglu_reference(project(rmsnorm_reference(x, norm_weight, eps), weight, scale, None, offset))


prepare = gate_up_prepare(SPEC.name)

# rmsnorm -> packed gate/up projection (no bias) -> GeGLU; the golden call is fused_norm_swiglu's (same operands)
FUSION = Fusion(
    pattern=("rmsnorm", "linear", "geglu"),
    inputs={"x": "0.x", "norm_weight": "0.weight", "proj": "1.proj"},
    attributes={"eps": "0.eps"},
    outputs={"y": "2.y"},
    schemes=FUSED_SCHEMES,
    takes_bias=False,
)

OPERATORS = (
    Operator(SPEC, fused_norm_geglu_reference, fused_precision(SPEC.name), golden_inputs,
             call_shape=lambda t, a: weight_shape(t), triton="fused_norm_geglu_triton:OP", prepare=prepare,
             tiles_at={"norm_geglu_fp": DECODE, "norm_geglu_w8": DECODE, "norm_geglu_w4": DECODE}, fusion=FUSION),
)
