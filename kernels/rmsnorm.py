"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight."""

from __future__ import annotations

import torch

from edgekit.errors import OperatorError
from edgekit.kernels import host_checks as hc
from edgekit.kernels.operator import PREFILL, OnnxFunction, OpPrecision, Operator, golden_rand
from edgekit.kernels.precision import accumulate_dtype
from edgekit.kernels.spec import ELEMENTWISE_TOLERANCE, FLOAT_DTYPES, OpSpec, TensorSpec

MAX_ROW = 65536  # one row must fit one program's registers (the kernel holds it whole)

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


def golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    C = cfg.hidden_size
    return {"x": golden_rand(g, rows, C), "weight": (1 + 0.1 * torch.randn(C, generator=g)).to(torch.float16)}, {"eps": cfg.rms_norm_eps}


# -- ONNX fallback body: standard ONNX ops that follow the reference step by step (export/onnx_functions.py
#    builds the model-local FunctionProto from it; ``b`` is its Body builder)


def onnx_rmsnorm(b, i: dict, out: list[str]) -> None:
    x = b.f32(i["x"])
    mean_sq = b("ReduceMean", b("Mul", x, x), axes=[-1], keepdims=1)  # (..., 1)
    inv_rms = b("Reciprocal", b("Sqrt", b("Add", mean_sq, b.attr_const("eps", "float"))))
    b.like(b("Mul", b("Mul", x, inv_rms), b.f32(i["weight"])), i["x"], out[0])


def prepare(x: torch.Tensor, weight: torch.Tensor, eps: float):
    op = "rmsnorm"
    hc.on_cuda(op, ("x", x), ("weight", weight))
    hc.act_dtype(op, x, "x")
    hc.same_dtype(op, weight, "weight", x, "x")
    if x.shape[-1] > MAX_ROW:
        raise OperatorError(f"{op}: row length {x.shape[-1]} exceeds the kernel's {MAX_ROW}")
    hc.vector(op, weight, "weight", x.shape[-1])
    x2 = hc.rows(op, x, "x")  # (M, C)
    return {"x": x2, "weight": weight}, {"eps": float(eps)}, lambda bufs: bufs["y"].view(x.shape)


OPERATORS = (
    Operator(
        SPEC, rmsnorm_reference, OpPrecision("rmsnorm", "fp16", "fp16", "fp32", "fp16"), golden_inputs,
        call_shape=lambda t, a: {"hidden_size": t["x"].shape[1]},
        triton="rmsnorm_triton:OP", prepare=prepare, tiles_at={"rmsnorm_fwd": PREFILL}, rowwise=True,
        onnx=OnnxFunction("RMSNorm", ("eps",), onnx_rmsnorm),
    ),
)
