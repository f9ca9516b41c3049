"""Linear layers: floating point, INT8 weight-only (W8A16), INT4 weight-only (W4A16) and INT8xINT8 (W8A8).

The model holds each projection as a ``LinearWeights`` record that names the
operator it needs; ``DispatchTable.linear`` routes it, so the model code is the
same for every precision.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from edgekit.errors import OperatorError
from edgekit.kernels import host_checks as hc
from edgekit.kernels.operator import (DECODE, GOLDEN_MAX_N, PREFILL, OnnxFunction, OpPrecision, Operator, PlannedShape, cdiv,
                                      golden_rand)
from edgekit.kernels.int4_layout import GROUP_SIZES, Q_MAX, SUBBLOCK, SYMMETRIC_ZERO, dequantize_int4, pack_int4
from edgekit.kernels.int8_group_layout import dequantize_int8_grouped
from edgekit.kernels.precision import accumulate_dtype, product_in
from edgekit.kernels.spec import FLOAT_DTYPES, REDUCTION_TOLERANCE, OpSpec, TensorSpec, Tolerance
from edgekit.kernels.weight_schemes import INT8_GGUF_GROUP, SCHEMES, Grouping, int4_group_for

INT8_MAX = 127.0
MIN_SCALE = torch.finfo(torch.float32).tiny  # the smallest scale a quantizer writes: a divisor never zero

LINEAR_SPEC = OpSpec(
    name="linear",
    abi_version=1,
    inputs=(
        TensorSpec("x", "(..., K)", FLOAT_DTYPES),
        TensorSpec("weight", "(N, K)", FLOAT_DTYPES),
        TensorSpec("bias", "(N,)", FLOAT_DTYPES, optional=True),
    ),
    outputs=(TensorSpec("y", "(..., N)", FLOAT_DTYPES),),
    tolerance=REDUCTION_TOLERANCE,
    doc="y = x @ weight.T + bias, accumulated in FP32 (FP64 for FP64 input).",
)

W8A16_SPEC = OpSpec(
    name="linear_w8a16",
    abi_version=1,
    inputs=(
        TensorSpec("x", "(..., K)", FLOAT_DTYPES),
        TensorSpec("qweight", "(N, K)", ("int8",)),
        TensorSpec("scale", "(N,)", ("float32",)),
        TensorSpec("bias", "(N,)", FLOAT_DTYPES, optional=True),
    ),
    outputs=(TensorSpec("y", "(..., N)", FLOAT_DTYPES),),
    tolerance=REDUCTION_TOLERANCE,
    doc="Weight-only INT8: y = (x @ qweight.T) * scale + bias; the FP64 reference dequantizes exactly.",
)

W8A8_SPEC = OpSpec(
    name="linear_w8a8",
    abi_version=1,
    inputs=(
        TensorSpec("x", "(..., K)", FLOAT_DTYPES),
        TensorSpec("qweight", "(N, K)", ("int8",)),
        TensorSpec("scale", "(N,)", ("float32",)),
        TensorSpec("bias", "(N,)", FLOAT_DTYPES, optional=True),
        TensorSpec("smooth", "(K,)", ("float32",), optional=True),
    ),
    outputs=(TensorSpec("y", "(..., N)", FLOAT_DTYPES),),
    # The activations are rounded to INT8 per token, so the error against the
    # unquantized product is bounded by the rounding, not by FP arithmetic: the
    # FP64 reference quantizes the activations the same way and the kernel must
    # match it to FP32 rounding of the int32 result.
    tolerance={k: Tolerance(atol=v.atol, rtol=v.rtol) for k, v in REDUCTION_TOLERANCE.items()},
    doc=(
        "INT8 x INT8 with per-token dynamic activation scales: x' = x / smooth; "
        "xq = round(x' / sx), sx = max|x'| / 127 per row; y = (xq @ qweight.T) * sx * scale + bias, "
        "int32 accumulation."
    ),
)


W4A16_SPEC = OpSpec(
    name="linear_w4a16",
    abi_version=1,
    inputs=(
        TensorSpec("x", "(..., K)", FLOAT_DTYPES),
        TensorSpec("qweight", "(N, K/2)", ("uint8",)),
        TensorSpec("scale", "(N, K/G)", ("float16", "float32")),
        TensorSpec("offset", "(N, K/G)", ("float16", "float32"), optional=True),
        TensorSpec("bias", "(N,)", FLOAT_DTYPES, optional=True),
    ),
    outputs=(TensorSpec("y", "(..., N)", FLOAT_DTYPES),),
    tolerance=REDUCTION_TOLERANCE,
    doc=(
        "Weight-only group-wise INT4 (kernels/int4_layout.py): w = q * scale + offset, or (q - 8) * scale without "
        "offset, G = K / scale.shape[1]; y = x @ w.T + bias. The FP64 reference dequantizes exactly."
    ),
)


_SPECS = {s.name: s for s in (LINEAR_SPEC, W8A16_SPEC, W4A16_SPEC, W8A8_SPEC)}


@dataclass
class LinearWeights:
    """One projection's weights and the operator that applies them."""

    op: str  # "linear" | "linear_w8a16" | "linear_w4a16" | "linear_w8a8" | "linear_w8a16_grouped"
    weight: torch.Tensor  # (N, K) float, int8 for the INT8 ops, packed uint8 (N, K/2) for W4A16
    bias: torch.Tensor | None = None  # (N,)
    scale: torch.Tensor | None = None  # (N,) fp32 for the INT8 ops; (N, K/G) fp16/fp32 group scales for W4A16 and grouped INT8
    smooth: torch.Tensor | None = None  # (K,) fp32, SmoothQuant divisor for W8A8
    offset: torch.Tensor | None = None  # (N, K/G) W4A16 asymmetric group offsets (None: symmetric)

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    @property
    def in_features(self) -> int:
        return self.weight.shape[1] * (2 if self.op == "linear_w4a16" else 1)

    def operator_args(self) -> tuple:
        """The tensors after ``x`` that the record's operator takes, in its spec's order."""
        by_name = {"weight": self.weight, "qweight": self.weight, "scale": self.scale, "bias": self.bias,
                   "smooth": self.smooth, "offset": self.offset}
        spec = _SPECS.get(self.op)
        if spec is None:  # a linear operator declared in its own module (e.g. linear_w8a16_grouped)
            from edgekit.kernels.registry import operator

            spec = operator(self.op).spec
        return tuple(by_name[t.name] for t in spec.inputs[1:])

    def nbytes(self) -> int:
        parts = (self.weight, self.bias, self.scale, self.smooth, self.offset)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    def dequantized(self, rows: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
                    out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """The floating-point weight this record stands for (with SmoothQuant folded back), computed in ``dtype``
        (FP32; FP64 for an oracle) and returned in ``out_dtype`` (default ``dtype``): each value rounded once from
        the computed one, by the last op writing that dtype (a lookup's activation dtype without a cast kernel).
        ``rows``: only those output rows (a tied embedding's lookup). A float record returns its weight as stored."""

        def pick(t: torch.Tensor | None) -> torch.Tensor | None:  # index_select: one plain gather kernel a tensor
            return t if t is None or rows is None else t.index_select(0, rows)

        out_dtype = dtype if out_dtype is None else out_dtype
        if self.op == "linear":
            return pick(self.weight)
        if accumulate_dtype(out_dtype) != accumulate_dtype(dtype):  # e.g. an FP64 oracle asked for FP16 values
            return self.dequantized(rows, dtype).to(out_dtype)
        if self.op == "linear_w4a16":  # computed in ``dtype``'s accumulation dtype, returned in ``out_dtype``
            return dequantize_int4(pick(self.weight), pick(self.scale), pick(self.offset), dtype=out_dtype)
        if self.op == "linear_w8a16_grouped":
            return dequantize_int8_grouped(pick(self.weight), pick(self.scale), dtype=out_dtype)
        # INT8: one scale per row; the int8 codes convert inside the product (computed in ``dtype``, the scales')
        codes, scale = pick(self.weight), pick(self.scale).to(dtype)[:, None]
        if self.smooth is None:
            return product_in(codes, scale, out_dtype)
        # W8A8: the SmoothQuant divisor is per input column
        return ((codes * scale) / self.smooth.to(dtype)[None, :]).to(out_dtype)

    def to(self, device=None, dtype=None) -> "LinearWeights":
        """Move to a device; ``dtype`` applies only to floating-point weights and the bias."""

        def move(t: torch.Tensor | None, cast: bool) -> torch.Tensor | None:
            if t is None:
                return None
            return t.to(device=device, dtype=dtype if cast and dtype is not None else t.dtype)

        return LinearWeights(
            op=self.op,
            weight=move(self.weight, self.op == "linear"),
            bias=move(self.bias, True),
            scale=move(self.scale, False),
            smooth=move(self.smooth, False),
            offset=move(self.offset, False),
        )


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    acc = accumulate_dtype(x.dtype)
    y = x.to(acc) @ weight.to(acc).T
    if bias is not None:
        y = y + bias.to(acc)
    return y.to(x.dtype)


def linear_w8a16_reference(
    x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    acc = accumulate_dtype(x.dtype)
    y = (x.to(acc) @ qweight.to(acc).T) * scale.to(acc)
    if bias is not None:
        y = y + bias.to(acc)
    return y.to(x.dtype)


def linear_w4a16_reference(
    x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    acc = accumulate_dtype(x.dtype)
    y = x.to(acc) @ dequantize_int4(qweight, scale, offset, dtype=acc).T
    if bias is not None:
        y = y + bias.to(acc)
    return y.to(x.dtype)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric dynamic INT8 per row of the last axis. Returns (int8 values, fp32 scale (..., 1)).

    An all-zero row gets scale 1 (not 0), so dequantizing never divides by zero.
    """
    xf = x.to(accumulate_dtype(x.dtype))
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
    q = torch.clamp(torch.round(xf / scale), -INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale.to(torch.float32) if x.dtype != torch.float64 else scale


def exact_int_matmul(xq: torch.Tensor, qweight: torch.Tensor) -> torch.Tensor:
    """Exact int8 (..., K) @ int8 (N, K).T as a float tensor holding integers.

    Every product and partial sum is an integer of magnitude <= K * 127^2: FP32 holds it exactly below
    2^24 (K <= 1040), FP64 below 2^53. A BLAS float matmul is ~15x faster than PyTorch's int64 matmul on
    a CPU, and CUDA has no int64 matmul at all.
    """
    bound = xq.shape[-1] * INT8_MAX * INT8_MAX
    dt = torch.float32 if bound < 2**24 else torch.float64
    assert bound < 2**53, "K too large for an exact floating-point integer product"
    return xq.to(dt) @ qweight.to(dt).T


def linear_w8a8_reference(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    smooth: torch.Tensor | None = None,
) -> torch.Tensor:
    acc = accumulate_dtype(x.dtype)
    xs = x.to(acc)
    if smooth is not None:
        xs = xs / smooth.to(acc)
    xq, sx = quantize_per_token(xs)
    y_int = exact_int_matmul(xq, qweight)  # (..., N), the kernel's int32 accumulation, exactly
    y = y_int.to(acc) * sx.to(acc) * scale.to(acc)
    if bias is not None:
        y = y + bias.to(acc)
    return y.to(x.dtype)


# -- registry records ---------------------------------------------------------------------------------


def _int8_weight(g: torch.Generator, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scale = (torch.rand(n, generator=g) * 0.01 + 1e-3).to(torch.float32)  # (N,) never zero
    return q, scale


def linear_golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    C, n = cfg.hidden_size, min(GOLDEN_MAX_N, cfg.hidden_size)
    inp = {"x": golden_rand(g, rows, C), "weight": golden_rand(g, n, C, std=C ** -0.5)}
    if cfg.qkv_bias:
        inp["bias"] = golden_rand(g, n, std=0.1)
    return inp, {}


def w8a16_golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    C = cfg.hidden_size
    q, s = _int8_weight(g, min(GOLDEN_MAX_N, C), C)
    return {"x": golden_rand(g, rows, C), "qweight": q, "scale": s}, {}


def w4a16_golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    C, n = cfg.hidden_size, min(GOLDEN_MAX_N, cfg.hidden_size)
    group = max(gs for gs in GROUP_SIZES if C % gs == 0)
    q = torch.randint(0, Q_MAX + 1, (n, C), generator=g, dtype=torch.uint8)
    scale = (torch.rand(n, C // group, generator=g) * 0.01 + 1e-3).to(torch.float16)  # never zero
    offset = (-8 * scale.to(torch.float32) * (0.5 + torch.rand(n, C // group, generator=g))).to(torch.float16)
    return {"x": golden_rand(g, rows, C), "qweight": pack_int4(q), "scale": scale, "offset": offset}, {}


def w8a8_golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    C = cfg.hidden_size
    q, s = _int8_weight(g, min(GOLDEN_MAX_N, C), C)
    smooth = (torch.rand(C, generator=g) + 0.5).to(torch.float32)  # (K,) positive divisors
    return {"x": golden_rand(g, rows, C), "qweight": q, "scale": s, "smooth": smooth}, {}


# -- ONNX fallback body: standard ONNX ops that follow the reference step by step (export/onnx_functions.py
#    builds the model-local FunctionProto from it; ``b`` is its Body builder)


def onnx_matmul_nt(b, x: str, w: str, bias: str | None) -> str:
    """x (..., K) @ w.T (N, K) [+ bias], FP32 in and out, as a Gemm on the flattened rows."""
    rows = b("Flatten", x, axis=-1)  # (M, K)
    y = b("Gemm", rows, w, *([bias] if bias else []), transB=1)  # (M, N)
    shape = b("Concat", b("Shape", x, end=-1), b("Shape", w, start=0, end=1), axis=0)  # [..., N]
    return b("Reshape", y, shape)  # (..., N)


def onnx_linear(b, i: dict, out: list[str]) -> None:
    bias = b.f32(i["bias"]) if i["bias"] else None
    b.like(onnx_matmul_nt(b, b.f32(i["x"]), b.f32(i["weight"]), bias), i["x"], out[0])


def onnx_linear_w8a16(b, i: dict, out: list[str]) -> None:
    # x @ (q * s).T instead of the reference's (x @ q.T) * s: equal up to FP32 rounding,
    # and the DequantizeLinear -> Gemm pattern is the one runtimes recognise as weight-only INT8.
    w = b("DequantizeLinear", i["qweight"], i["scale"], axis=0)  # (N, K) fp32
    bias = b.f32(i["bias"]) if i["bias"] else None
    b.like(onnx_matmul_nt(b, b.f32(i["x"]), w, bias), i["x"], out[0])


def onnx_linear_w4a16(b, i: dict, out: list[str]) -> None:
    # Unpack in FP32 arithmetic (exact for bytes 0..255, and no integer ops a runtime may lack): high nibble
    # floor(q / 16), low nibble q - 16 * high; GGML order puts a 32-block's low nibbles first, then its high ones.
    qf = b("Cast", i["qweight"], to=b.FLOAT)  # (N, K/2)
    hi = b("Floor", b("Div", qf, b.const(16.0)))
    lo = b("Sub", qf, b("Mul", hi, b.const(16.0)))
    n = b("Shape", i["qweight"], start=0, end=1)  # [N]
    blocks = b("Concat", n, b.const([-1, 1, 16], np.int64), axis=0)  # (N, K/32, 1, 16)
    q = b("Concat", b("Reshape", lo, blocks), b("Reshape", hi, blocks), axis=2)  # (N, K/32, 2, 16)
    groups = b("Concat", n, b("Shape", i["scale"], start=1, end=2), b.const([-1], np.int64), axis=0)
    q = b("Reshape", q, groups)  # (N, K/G, G): element order restored, one group a row
    scale = b("Unsqueeze", b.f32(i["scale"]), b.const([2], np.int64))  # (N, K/G, 1)
    if i["offset"]:
        w = b("Add", b("Mul", q, scale), b("Unsqueeze", b.f32(i["offset"]), b.const([2], np.int64)))
    else:
        w = b("Mul", b("Sub", q, b.const(float(SYMMETRIC_ZERO))), scale)
    w = b("Reshape", w, b("Concat", n, b.const([-1], np.int64), axis=0))  # (N, K) fp32
    bias = b.f32(i["bias"]) if i["bias"] else None
    b.like(onnx_matmul_nt(b, b.f32(i["x"]), w, bias), i["x"], out[0])


def onnx_linear_w8a8(b, i: dict, out: list[str]) -> None:
    x = b.f32(i["x"])
    if i["smooth"]:
        x = b("Div", x, i["smooth"])  # SmoothQuant: x' = x / smooth
    # Per-token symmetric INT8, exactly as quantize_per_token: an all-zero row gets scale 1.
    amax = b("ReduceMax", b("Abs", x), axes=[-1], keepdims=1)  # (..., 1)
    sx = b("Where", b("Greater", amax, b.const(0.0)), b("Div", amax, b.const(INT8_MAX)), b.const(1.0))
    xq = b("Clip", b("Round", b("Div", x, sx)), b.const(-INT8_MAX), b.const(INT8_MAX))  # Round: half to even, like torch
    xq = b("Cast", xq, to=b.INT8)
    # Integer product with int32 accumulation (exact for K < 2^17), then the two scales.
    y_int = b("MatMulInteger", xq, b("Transpose", i["qweight"], perm=[1, 0]))  # (..., N) int32
    y = b("Mul", b("Mul", b("Cast", y_int, to=b.FLOAT), sx), i["scale"])
    if i["bias"]:
        y = b("Add", y, b.f32(i["bias"]))
    b.like(y, i["x"], out[0])

def _gemm_grid(kernel: str, at: PlannedShape):
    """Programs of a GEMM tile at the prefill shape, on the narrowest projection the operator runs."""
    if not kernel.endswith("_gemm"):
        return None, None
    op = {"linear_gemm": "linear", "w8a16_gemm": "linear_w8a16", "w4a16_gemm": "linear_w4a16",
          "w8a8_gemm": "linear_w8a8"}[kernel]
    n, rows = at.out_features(op), at.prefill_rows
    return (lambda v: cdiv(rows, v.constexprs["BLOCK_M"]) * cdiv(n, v.constexprs["BLOCK_N"])), at.sms


def _rows(tensors, attrs) -> dict:
    return {"rows": tensors["x"].shape[0]}


_LINEAR = dict(call_shape=_rows, grid=_gemm_grid, rowwise=True, decode_case=True)


def _prepare_common(op: str, x, weight, bias, extra: dict, weight_dtype: torch.dtype | None):
    hc.on_cuda(op, ("x", x), ("weight", weight), ("bias", bias), *extra.items())
    hc.act_dtype(op, x, "x")
    if weight_dtype is None:
        hc.same_dtype(op, weight, "weight", x, "x")
    else:
        hc.dtype_is(op, weight, "weight", weight_dtype)
    hc.ndim(op, weight, "weight", 2, "(N, K)")
    hc.unit_last_stride(op, weight, "weight")
    if x.shape[-1] != weight.shape[1]:
        raise OperatorError(f"{op}: x has {x.shape[-1]} features but weight is {tuple(weight.shape)} (N, K)")
    N = weight.shape[0]
    if bias is not None:
        hc.same_dtype(op, bias, "bias", x, "x")
        hc.vector(op, bias, "bias", N)
    x2 = hc.rows(op, x, "x")  # (M, K)
    out_shape = (*x.shape[:-1], N)
    return x2, (lambda bufs: bufs["y"].view(out_shape))


def prepare_linear(x, weight, bias=None):
    x2, finish = _prepare_common("linear", x, weight, bias, {}, None)
    return {"x": x2, "weight": weight, "bias": bias}, {}, finish


def prepare_w8a16(x, qweight, scale, bias=None):
    op = "linear_w8a16"
    x2, finish = _prepare_common(op, x, qweight, bias, {"scale": scale}, torch.int8)
    hc.dtype_is(op, scale, "scale", torch.float32)
    hc.vector(op, scale, "scale", qweight.shape[0])
    return {"x": x2, "weight": qweight, "scale": scale, "bias": bias}, {}, finish


def prepare_w8a8(x, qweight, scale, bias=None, smooth=None):
    op = "linear_w8a8"
    x2, finish = _prepare_common(op, x, qweight, bias, {"scale": scale, "smooth": smooth}, torch.int8)
    hc.dtype_is(op, scale, "scale", torch.float32)
    hc.vector(op, scale, "scale", qweight.shape[0])
    if smooth is not None:
        hc.dtype_is(op, smooth, "smooth", torch.float32)
        hc.vector(op, smooth, "smooth", qweight.shape[1])
    if qweight.shape[1] >= 2**17:
        raise OperatorError(f"{op}: K = {qweight.shape[1]} could overflow the int32 accumulator; expected K < 131072")
    return {"x": x2, "weight": qweight, "scale": scale, "bias": bias, "smooth": smooth}, {}, finish


def prepare_w4a16(x, qweight, scale, offset=None, bias=None):
    """The call's tensors in the program's slots: scale/offset go to the FP16 or FP32 slot of their dtype."""
    op = "linear_w4a16"
    hc.on_cuda(op, ("x", x), ("qweight", qweight), ("scale", scale), ("offset", offset), ("bias", bias))
    hc.act_dtype(op, x, "x")
    slots, attrs = int4_weight_slots(op, qweight, scale, offset, "qweight", x_features=x.shape[-1])
    n = qweight.shape[0]
    if bias is not None:
        hc.same_dtype(op, bias, "bias", x, "x")
        hc.vector(op, bias, "bias", n)
    x2 = hc.rows(op, x, "x")  # (M, K)
    tensors = {"x": x2, "weight": qweight, **slots, "bias": bias}
    out_shape = (*x.shape[:-1], n)
    return tensors, attrs, (lambda bufs: bufs["y"].view(out_shape))


def int4_weight_slots(op: str, qweight, scale, offset, name: str = "weight",
                      x_features: int | None = None) -> tuple[dict, dict]:
    """Host checks of packed INT4 (W4A16) weight operands, shared by every kernel that takes them (this GEMV and the
    fused decode GEMVs): qweight uint8 (N, K/2), scale (N, K/G) FP16 or FP32 with G in GROUP_SIZES, offset None or
    like the scale. Returns the scale and offset in the program slots of their dtype (``scale_h`` / ``offset_h`` for
    FP16, ``scale_f`` / ``offset_f`` for FP32, None in the others) and the attributes the kernels read
    (``scale_row_stride``, ``group_shift``: G = 32 << group_shift). ``x_features``: the activation's width, checked
    against the K the packed weight holds."""
    hc.dtype_is(op, qweight, name, torch.uint8)
    hc.ndim(op, qweight, name, 2, "(N, K/2)")
    hc.unit_last_stride(op, qweight, name)
    n, k = qweight.shape[0], qweight.shape[1] * 2
    if x_features is not None and x_features != k:
        raise OperatorError(f"{op}: x has {x_features} features but the packed {name} {tuple(qweight.shape)} "
                            f"holds K = {k}", hint=f"{name} is (N, K/2): two 4-bit weights a byte")
    if scale is None:
        raise OperatorError(f"{op}: packed INT4 {name} {tuple(qweight.shape)} came without group scales",
                            hint="pass the (N, K/G) scale of the W4A16 weights (kernels/int4_layout.py)")
    if scale.dtype not in (torch.float16, torch.float32):
        raise OperatorError(f"{op}: scale has dtype {scale.dtype}; expected float16 or float32")
    hc.ndim(op, scale, "scale", 2, "(N, K/G)")
    hc.unit_last_stride(op, scale, "scale")
    groups = scale.shape[1]
    g = k // groups if groups and k % groups == 0 else 0
    if scale.shape[0] != n or g not in GROUP_SIZES:
        raise OperatorError(f"{op}: scale has shape {tuple(scale.shape)} for K = {k}, N = {n}; expected (N, K/G) "
                            f"with G in {GROUP_SIZES}")
    if offset is not None:
        hc.same_dtype(op, offset, "offset", scale, "scale")
        if offset.shape != scale.shape or offset.stride() != scale.stride():
            raise OperatorError(f"{op}: offset has shape {tuple(offset.shape)} strides {offset.stride()}; "
                                f"expected the scale's {tuple(scale.shape)} {scale.stride()}")
    f32 = scale.dtype == torch.float32
    slots = {"scale_h": None if f32 else scale, "offset_h": None if f32 else offset,
             "scale_f": scale if f32 else None, "offset_f": offset if f32 else None}
    return slots, {"scale_row_stride": scale.stride(0), "group_shift": (g // SUBBLOCK).bit_length() - 1}


OPERATORS = (
    Operator(LINEAR_SPEC, linear_reference, OpPrecision("linear", "fp16", "fp16", "fp32", "fp16"), linear_golden_inputs,
             triton="linear_triton:LINEAR_OP",
             prepare=prepare_linear, tiles_at={"linear_gemv": DECODE, "linear_gemm": PREFILL},
             onnx=OnnxFunction("Linear", (), onnx_linear), **_LINEAR),
    Operator(W8A16_SPEC, linear_w8a16_reference, OpPrecision("linear_w8a16", "int8", "fp16", "fp32", "fp16"),
             w8a16_golden_inputs, triton="linear_triton:W8A16_OP",
             prepare=prepare_w8a16, tiles_at={"w8a16_gemv": DECODE, "w8a16_gemm": PREFILL},
             onnx=OnnxFunction("LinearW8A16", (), onnx_linear_w8a16), **_LINEAR),
    Operator(W4A16_SPEC, linear_w4a16_reference, OpPrecision("linear_w4a16", "int4", "fp16", "fp32", "fp16"),
             w4a16_golden_inputs, triton="linear_w4a16_triton:W4A16_OP", prepare=prepare_w4a16,
             tiles_at={"w4a16_gemv": DECODE, "w4a16_gemm": PREFILL},
             onnx=OnnxFunction("LinearW4A16", (), onnx_linear_w4a16), **_LINEAR),
    Operator(W8A8_SPEC, linear_w8a8_reference, OpPrecision("linear_w8a8", "int8", "int8", "int32", "fp16"),
             w8a8_golden_inputs, triton="linear_triton:W8A8_OP",
             prepare=prepare_w8a8, tiles_at={"w8a8_quantize": PREFILL, "w8a8_gemm": PREFILL},
             onnx=OnnxFunction("LinearW8A8", (), onnx_linear_w8a8), **_LINEAR),
)


def empty_linear(name: str, out_features: int, in_features: int, bias: bool, grouping: Grouping = Grouping(),
                 device="meta", dtype=None):
    """A projection record of scheme ``name`` with uninitialised tensors of the stored shapes and dtypes (on the
    meta device by default: what counting kernel launches needs, at no memory)."""
    dtype = dtype or torch.float16
    n, k = out_features, in_features

    def empty(*shape, dt=dtype):
        return torch.empty(*shape, dtype=dt, device=device)

    b = empty(n) if bias else None
    if name == "fp16":
        return LinearWeights("linear", empty(n, k), b)
    if name in ("w8a16", "w8a8"):
        return LinearWeights(SCHEMES[name].operator, empty(n, k, dt=torch.int8), b, scale=empty(n, dt=torch.float32),
                             smooth=empty(k, dt=torch.float32) if name == "w8a8" else None)
    if name == "w4a16":
        groups = k // int4_group_for(k, grouping.group)
        offset = empty(n, groups, dt=torch.float16) if grouping.group_bytes > 2 else None
        return LinearWeights("linear_w4a16", empty(n, k // 2, dt=torch.uint8), b, scale=empty(n, groups, dt=torch.float16),
                             offset=offset)
    if name == "w8a16g":
        return LinearWeights("linear_w8a16_grouped", empty(n, k, dt=torch.int8), b,
                             scale=empty(n, -(-k // INT8_GGUF_GROUP), dt=torch.float16))
    raise OperatorError(f"unknown weight scheme {name!r}; expected one of: {', '.join(SCHEMES)}")
