"""Fused decode operator: projection + residual add (the attention output projection and the MLP down projection)."""

from __future__ import annotations

import torch

from edgekit.kernels import host_checks as hc
from edgekit.kernels.fused_decode_common import (
    FLOAT_DTYPES, FUSED_SCHEMES, fused_precision, golden_weight, project, weight_inputs, weight_operands,
    weight_shape,
)
from edgekit.kernels.fusion import Fusion
from edgekit.kernels.operator import DECODE, Operator, golden_rand
from edgekit.kernels.spec import REDUCTION_TOLERANCE, OpSpec, TensorSpec

SPEC = OpSpec(
    name="fused_proj_residual",
    abi_version=1,
    inputs=(TensorSpec("x", "(B, K)", FLOAT_DTYPES), *weight_inputs("N", "K"), TensorSpec("residual", "(B, N)", FLOAT_DTYPES)),
    outputs=(TensorSpec("y", "(B, N)", FLOAT_DTYPES),),
    tolerance=REDUCTION_TOLERANCE,
    doc="y = residual + (x @ W.T + bias), the projection rounded to the activation dtype before the add.",
)


def fused_proj_residual_reference(x, weight, scale, offset, bias, residual) -> torch.Tensor:
    return residual + project(x, weight, scale, bias, offset)


def golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    """One decode call of the attention output projection (C -> C) with its residual."""
    C = cfg.hidden_size
    x, w = golden_rand(g, rows, C), golden_weight(g, C, C, bias=False)
    return {"x": x, **w, "residual": golden_rand(g, rows, w["weight"].shape[0])}, {}  # residual: the (capped) N outputs


def prepare(x, weight, scale, offset, bias, residual):
    op = SPEC.name
    hc.on_cuda(op, ("x", x), ("weight", weight), ("scale", scale), ("offset", offset), ("bias", bias), ("residual", residual))
    hc.act_dtype(op, x, "x")
    hc.ndim(op, x, "x", 2, "(B, K)")
    hc.unit_last_stride(op, x, "x")
    N = weight.shape[0]
    operands, attrs = weight_operands(op, x, weight, scale, offset, N, x.shape[1])
    if bias is not None:
        hc.same_dtype(op, bias, "bias", x, "x")
        hc.vector(op, bias, "bias", N)
    hc.same_dtype(op, residual, "residual", x, "x")
    if tuple(residual.shape) != (x.shape[0], N):
        from edgekit.errors import OperatorError

        raise OperatorError(f"{op}: residual has shape {tuple(residual.shape)}; expected ({x.shape[0]}, {N})")
    hc.unit_last_stride(op, residual, "residual")
    return {"x": x, **operands, "bias": bias, "residual": residual}, attrs, lambda bufs: bufs["y"]


# a projection and the residual add after it (the MLP's down projection)
FUSION = Fusion(
    pattern=("linear", "add"),
    inputs={"x": "0.x", "proj": "0.proj", "residual": "1.a"},
    outputs={"y": "1.y"},
    schemes=FUSED_SCHEMES,
)

OPERATORS = (
    Operator(SPEC, fused_proj_residual_reference, fused_precision(SPEC.name), golden_inputs,
             call_shape=lambda t, a: weight_shape(t), triton="fused_proj_residual_triton:OP", prepare=prepare,
             tiles_at={"proj_residual_fp": DECODE, "proj_residual_w8": DECODE, "proj_residual_w4": DECODE}, fusion=FUSION),
)
