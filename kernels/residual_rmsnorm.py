"""Residual add + RMSNorm in one operator: s = x + residual; y = rmsnorm(s) * weight.

The decoder adds each block's projection into the residual stream and then
normalises it for the next stage (``x = x + wo(...)``; ``h = rmsnorm(x)``).
Fused, the stream is read once instead of three times and one launch goes
away per use. Both results are returned: ``s`` is the new residual stream.
``s`` is rounded to the activation dtype before the norm, exactly as the
unfused ``x + ...`` followed by ``rmsnorm`` does, so the two paths agree.
"""

from __future__ import annotations

import torch

from edgekit.errors import OperatorError
from edgekit.kernels import host_checks as hc
from edgekit.kernels.operator import PREFILL, OnnxFunction, OpPrecision, Operator, golden_rand
from edgekit.kernels.rmsnorm import golden_inputs as rmsnorm_golden_inputs
from edgekit.kernels.rmsnorm import MAX_ROW, onnx_rmsnorm, rmsnorm_reference
from edgekit.kernels.spec import ELEMENTWISE_TOLERANCE, FLOAT_DTYPES, OpSpec, TensorSpec

SPEC = OpSpec(
    name="residual_rmsnorm",
    abi_version=1,
    inputs=(
        TensorSpec("x", "(..., C)", FLOAT_DTYPES),
        TensorSpec("residual", "(..., C)", FLOAT_DTYPES),
        TensorSpec("weight", "(C,)", FLOAT_DTYPES),
    ),
    outputs=(TensorSpec("y", "(..., C)", FLOAT_DTYPES), TensorSpec("s", "(..., C)", FLOAT_DTYPES)),
    attributes=("eps",),
    tolerance=ELEMENTWISE_TOLERANCE,
    doc="s = x + residual (rounded to the input dtype); y = rmsnorm(s, eps) * weight. Accumulates in FP32 (FP64 for FP64).",
)


def residual_rmsnorm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    s = (x.to(torch.float64 if x.dtype == torch.float64 else torch.float32) + residual).to(x.dtype)
    return rmsnorm_reference(s, weight, eps), s


def golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    inputs, attrs = rmsnorm_golden_inputs(cfg, rows, context, g)
    return {**inputs, "residual": golden_rand(g, rows, cfg.hidden_size)}, attrs


def onnx_residual_rmsnorm(b, i: dict, out: list[str]) -> None:
    """ONNX fallback body: the add rounded to the input dtype (output s), then RMSNorm's own body on it."""
    b.like(b("Add", b.f32(i["x"]), b.f32(i["residual"])), i["x"], out[1])
    onnx_rmsnorm(b, {"x": out[1], "weight": i["weight"]}, [out[0]])


def prepare(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    op = "residual_rmsnorm"
    hc.on_cuda(op, ("x", x), ("residual", residual), ("weight", weight))
    hc.act_dtype(op, x, "x")
    hc.same_dtype(op, residual, "residual", x, "x")
    hc.same_dtype(op, weight, "weight", x, "x")
    if residual.shape != x.shape:
        raise OperatorError(f"{op}: residual {tuple(residual.shape)} must have x's shape {tuple(x.shape)}")
    if x.shape[-1] > MAX_ROW:
        raise OperatorError(f"{op}: row length {x.shape[-1]} exceeds the kernel's {MAX_ROW}")
    hc.vector(op, weight, "weight", x.shape[-1])
    tensors = {"x": hc.rows(op, x, "x"), "residual": hc.rows(op, residual, "residual"), "weight": weight}  # (M, C)
    return tensors, {"eps": float(eps)}, lambda bufs: (bufs["y"].view(x.shape), bufs["s"].view(x.shape))


OPERATORS = (
    Operator(
        SPEC, residual_rmsnorm_reference, OpPrecision("residual_rmsnorm", "fp16", "fp16", "fp32", "fp16"), golden_inputs,
        call_shape=lambda t, a: {"hidden_size": t["x"].shape[1]},
        triton="residual_rmsnorm_triton:OP", prepare=prepare, tiles_at={"residual_rmsnorm_fwd": PREFILL}, rowwise=True,
        onnx=OnnxFunction("ResidualRMSNorm", ("eps",), onnx_residual_rmsnorm),
    ),
)
