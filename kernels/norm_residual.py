"""Fused decode operator: y = residual + rmsnorm(x) * weight (Gemma 3's post-attention and post-MLP norms).

Gemma normalises each branch's output before adding it to the residual stream
(``x = x + post_norm(o_proj(...))``). Fused, the branch is read once and the add
costs no launch of its own. The norm's output is rounded to the activation
dtype before the add, exactly as ``rmsnorm`` followed by the graph's add does,
so the two paths agree.
"""

from __future__ import annotations

import torch

from edgekit.errors import OperatorError
from edgekit.kernels import host_checks as hc
from edgekit.kernels.fusion import Fusion
from edgekit.kernels.operator import DECODE, OpPrecision, Operator, golden_rand
from edgekit.kernels.precision import accumulate_dtype
from edgekit.kernels.rmsnorm import golden_inputs as rmsnorm_golden_inputs
from edgekit.kernels.rmsnorm import MAX_ROW, rmsnorm_reference
from edgekit.kernels.spec import ELEMENTWISE_TOLERANCE, FLOAT_DTYPES, OpSpec, TensorSpec

SPEC = OpSpec(
    name="norm_residual",
    abi_version=1,
    inputs=(
        TensorSpec("x", "(B, C)", FLOAT_DTYPES),
        TensorSpec("weight", "(C,)", FLOAT_DTYPES),
        TensorSpec("residual", "(B, C)", FLOAT_DTYPES),
    ),
    outputs=(TensorSpec("y", "(B, C)", FLOAT_DTYPES),),
    attributes=("eps",),
    tolerance=ELEMENTWISE_TOLERANCE,
    doc="y = residual + rmsnorm(x, eps) * weight, the norm rounded to the input dtype before the add. Accumulates in "
        "FP32 (FP64 for FP64).",
)


def norm_residual_reference(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, eps: float) -> torch.Tensor:
    acc = accumulate_dtype(x.dtype)
    return (residual.to(acc) + rmsnorm_reference(x, weight, eps).to(acc)).to(x.dtype)


def golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    inputs, attrs = rmsnorm_golden_inputs(cfg, rows, context, g)
    return {**inputs, "residual": golden_rand(g, rows, cfg.hidden_size)}, attrs


def prepare(x, weight, residual, eps):
    op = SPEC.name
    hc.on_cuda(op, ("x", x), ("weight", weight), ("residual", residual))
    hc.act_dtype(op, x, "x")
    hc.same_dtype(op, weight, "weight", x, "x")
    hc.same_dtype(op, residual, "residual", x, "x")
    hc.ndim(op, x, "x", 2, "(B, C)")
    if residual.shape != x.shape:
        raise OperatorError(f"{op}: residual {tuple(residual.shape)} must have x's shape {tuple(x.shape)}")
    if x.shape[-1] > MAX_ROW:
        raise OperatorError(f"{op}: row length {x.shape[-1]} exceeds the kernel's {MAX_ROW}")
    hc.vector(op, weight, "weight", x.shape[-1])
    hc.unit_last_stride(op, x, "x")
    hc.unit_last_stride(op, residual, "residual")
    return {"x": x, "weight": weight, "residual": residual}, {"eps": float(eps)}, lambda bufs: bufs["y"]


# a norm of a branch and the residual add after it: the add's ``a`` is the residual stream, its ``b`` the norm
FUSION = Fusion(
    pattern=("rmsnorm", "add"),
    inputs={"x": "0.x", "weight": "0.weight", "residual": "1.a"},
    attributes={"eps": "0.eps"},
    outputs={"y": "1.y"},
    schemes=(),  # no projection
)

OPERATORS = (
    Operator(SPEC, norm_residual_reference, OpPrecision("norm_residual", "fp16", "fp16", "fp32", "fp16"),
             golden_inputs, call_shape=lambda t, a: {"hidden_size": t["x"].shape[1]},
             triton="norm_residual_triton:OP", prepare=prepare, tiles_at={"norm_residual_fwd": DECODE}, rowwise=True,
             fusion=FUSION),
)
