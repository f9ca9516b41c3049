"""Fused decode operator: RMSNorm -> packed gate/up projection -> SwiGLU."""

from __future__ import annotations

import torch

from edgekit.kernels.fused_decode_common import FLOAT_DTYPES, project, weight_inputs
from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.kernels.spec import REDUCTION_TOLERANCE, OpSpec, TensorSpec
from edgekit.kernels.swiglu import swiglu_reference

SPEC = OpSpec(
    name="fused_norm_swiglu",
    abi_version=1,
    inputs=(TensorSpec("x", "(B, C)", FLOAT_DTYPES), TensorSpec("norm_weight", "(C,)", FLOAT_DTYPES),
            *weight_inputs("2F", "C", bias=False)),
    outputs=(TensorSpec("y", "(B, F)", FLOAT_DTYPES),),
    attributes=("eps",),
    tolerance=REDUCTION_TOLERANCE,
    doc="y = silu(g) * u with [g | u] = rmsnorm(x) @ W.T; W packs the gate rows then the up rows.",
)


def fused_norm_swiglu_reference(x, norm_weight, weight, scale, eps: float) -> torch.Tensor:
    return swiglu_reference(project(rmsnorm_reference(x, norm_weight, eps), weight, scale, None))
