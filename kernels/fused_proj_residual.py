"""Fused decode operator: projection + residual add (the attention output projection and the MLP down projection)."""

from __future__ import annotations

import torch

from edgekit.kernels.fused_decode_common import FLOAT_DTYPES, project, weight_inputs
from edgekit.kernels.spec import REDUCTION_TOLERANCE, OpSpec, TensorSpec

SPEC = OpSpec(
    name="fused_proj_residual",
    abi_version=1,
    inputs=(TensorSpec("x", "(B, K)", FLOAT_DTYPES), *weight_inputs("N", "K"), TensorSpec("residual", "(B, N)", FLOAT_DTYPES)),
    outputs=(TensorSpec("y", "(B, N)", FLOAT_DTYPES),),
    tolerance=REDUCTION_TOLERANCE,
    doc="y = residual + (x @ W.T + bias), the projection rounded to the activation dtype before the add.",
)


def fused_proj_residual_reference(x, weight, scale, bias, residual) -> torch.Tensor:
    return residual + project(x, weight, scale, bias)
