"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight."""

from __future__ import annotations

import torch

from edgekit.kernels.precision import accumulate_dtype
from edgekit.kernels.spec import ELEMENTWISE_TOLERANCE, FLOAT_DTYPES, OpSpec, TensorSpec

SPEC = OpSpec(
    name="rmsnorm",
    abi_version=1,
    inputs=(TensorSpec("x", "(..., C)", FLOAT_DTYPES), TensorSpec("weight", "(C,)", FLOAT_DTYPES)),
    outputs=(TensorSpec("y", "(..., C)", FLOAT_DTYPES),),
    attributes=("eps",),
    tolerance=ELEMENTWISE_TOLERANCE,
    doc="Root-mean-square norm over the last axis, scaled by weight. Accumulates in FP32 (FP64 for FP64 input).",
)


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    acc = accumulate_dtype(x.dtype)
    xf = x.to(acc)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.to(acc)).to(x.dtype)
