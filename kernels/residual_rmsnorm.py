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

from edgekit.kernels.operator import PREFILL, OnnxFunction, OpPrecision, Operator, golden_rand
from edgekit.kernels.rmsnorm import golden_inputs as rmsnorm_golden_inputs
from edgekit.kernels.rmsnorm import onnx_rmsnorm, rmsnorm_reference
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


OPERATORS = (
    Operator(
        SPEC, residual_rmsnorm_reference, OpPrecision("residual_rmsnorm", "fp16", "fp16", "fp32", "fp16"), golden_inputs,
        call_shape=lambda t, a: {"hidden_size": t["x"].shape[1]},
        triton="residual_rmsnorm_triton:OP", tiles_at={"residual_rmsnorm_fwd": PREFILL}, rowwise=True,
        onnx=OnnxFunction("ResidualRMSNorm", ("eps",), onnx_residual_rmsnorm),
    ),
)
