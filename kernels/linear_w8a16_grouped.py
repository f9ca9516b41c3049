"""Weight-only INT8 with a scale per group of 32/64/128 weights (kernels/int8_group_layout.py): the operator that
runs a GGUF Q8_0 tensor taken in bit for bit.

Only the torch reference exists so far (no Triton kernel): on a GPU the runtime runs the reference for this
operator, and the fused decode operators do not take it (their fusions' schemes), so a model that uses it
runs the per-operator path and says why.
"""

from __future__ import annotations

import torch

from edgekit.kernels.int8_group_layout import GROUP_SIZES, dequantize_int8_grouped
from edgekit.kernels.linear import _LINEAR, onnx_matmul_nt
from edgekit.kernels.operator import GOLDEN_MAX_N, OnnxFunction, OpPrecision, Operator, golden_rand
from edgekit.kernels.precision import accumulate_dtype
from edgekit.kernels.spec import FLOAT_DTYPES, REDUCTION_TOLERANCE, OpSpec, TensorSpec

W8A16_GROUPED_SPEC = OpSpec(
    name="linear_w8a16_grouped",
    abi_version=1,
    inputs=(
        TensorSpec("x", "(..., K)", FLOAT_DTYPES),
        TensorSpec("qweight", "(N, K)", ("int8",)),
        TensorSpec("scale", "(N, K/G)", ("float16", "float32")),
        TensorSpec("bias", "(N,)", FLOAT_DTYPES, optional=True),
    ),
    outputs=(TensorSpec("y", "(..., N)", FLOAT_DTYPES),),
    tolerance=REDUCTION_TOLERANCE,
    doc=("Weight-only INT8 with group scales (kernels/int8_group_layout.py, GGML Q8_0 when G = 32): "
         "w = qweight * scale per group of G = K / scale.shape[1]; y = x @ w.T + bias. The FP64 reference dequantizes exactly."),
)


def linear_w8a16_grouped_reference(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                                   bias: torch.Tensor | None = None) -> torch.Tensor:
    # Dequantize (exact in FP32), then the float product: the same arithmetic as a float linear on the dequantized
    # weights, so a lossless intake gives the dequantized reference's outputs bit for bit.
    acc = accumulate_dtype(x.dtype)
    y = x.to(acc) @ dequantize_int8_grouped(qweight, scale, dtype=acc).T
    if bias is not None:
        y = y + bias.to(acc)
    return y.to(x.dtype)


def w8a16_grouped_golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    C, n = cfg.hidden_size, min(GOLDEN_MAX_N, cfg.hidden_size)
    group = max(gs for gs in GROUP_SIZES if C % gs == 0)
    q = torch.randint(-127, 128, (n, C), generator=g, dtype=torch.int8)
    scale = (torch.rand(n, C // group, generator=g) * 0.01 + 1e-3).to(torch.float16)
    return {"x": golden_rand(g, rows, C), "qweight": q, "scale": scale}, {}


def onnx_linear_w8a16_grouped(b, i: dict, out: list[str]) -> None:
    # (N, K) codes -> (N, K/G, G) * scale (N, K/G, 1) -> (N, K), in FP32 (exact), then the float product.
    import numpy as np

    q = b("Cast", i["qweight"], to=b.FLOAT)
    n = b("Shape", i["qweight"], start=0, end=1)  # [N]
    groups = b("Concat", n, b("Shape", i["scale"], start=1, end=2), b.const([-1], np.int64), axis=0)
    scale = b("Unsqueeze", b.f32(i["scale"]), b.const([2], np.int64))  # (N, K/G, 1)
    w = b("Reshape", b("Mul", b("Reshape", q, groups), scale), b("Concat", n, b.const([-1], np.int64), axis=0))
    bias = b.f32(i["bias"]) if i["bias"] else None
    b.like(onnx_matmul_nt(b, b.f32(i["x"]), w, bias), i["x"], out[0])


OPERATORS = (
    Operator(W8A16_GROUPED_SPEC, linear_w8a16_grouped_reference,
             OpPrecision("linear_w8a16_grouped", "int8", "fp16", "fp32", "fp16"), w8a16_grouped_golden_inputs,
             onnx=OnnxFunction("LinearW8A16Grouped", (), onnx_linear_w8a16_grouped),
             **_LINEAR),
)
