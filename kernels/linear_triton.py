"""Linear layers as Triton kernels: FP16 weights, INT8 weight-only (W8A16) and INT8 x INT8 (W8A8).

References: ``kernels/linear.py``. Four kernels:

- ``_matmul_kernel``: tiled GEMM on tensor cores (``tl.dot``, FP32 accumulation,
  ``input_precision="ieee"`` so FP32 inputs never silently become TF32). With
  ``W_INT8`` the weight tile is loaded as INT8 (half the bytes of FP16) and
  dequantised in registers; the per-output-channel scale is applied once to
  the accumulator, which is exact algebra: (x @ q.T) * s.
- ``_gemv_kernel``: the decode path (M of a few rows). A GEMV is bound by
  reading the weights once; each program streams a (BLOCK_N, BLOCK_K) weight
  slab and accumulates exact FP32 products with FMAs (no tensor cores).
- ``_quantize_rows_kernel``: W8A8's per-token dynamic activation quantisation
  (optional SmoothQuant divisor), rounding half to even like ``torch.round``.
- ``_w8a8_kernel``: INT8 x INT8 ``tl.dot`` into INT32, scaled by the token and
  channel scales in FP32.

INT8 -> FP16 dequantisation uses the exponent trick instead of the
int-to-float unit (a quarter-rate unit that would cap a GEMV below memory
bandwidth): the FP16 with bits 0x6400 + m is 1024 + m for an integer m < 1024,
so q + 128 placed in the mantissa, minus 1152, is q exactly.

Measured on the H200 (scripts/bench_kernels.py, M=1, 117 MB of INT8 weights):
this GEMV form ran at 46 us; keeping (BN, BK) FP32 partials across the loop
with a PRMT-based FP32 dequantisation ran slower (58-60 us), and the
tensor-core GEMM at BLOCK_M=16 (cp.async pipelined) at 47 us.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgekit.errors import OperatorError
from edgekit.kernels import host_checks as hc
from edgekit.kernels.kernel_def import KernelDef, OpKernels, Param, launch_of, pow2_at_least, program_doc
from edgekit.kernels.launch_rule import cdiv, check, mul, ptr, shape, stride

GEMV_MAX_ROWS = 8  # decode batches up to this many rows take the GEMV kernel when both are planned


@triton.jit
def _int8_to_act(w, DTYPE: tl.constexpr):
    if DTYPE == tl.float16:
        # exact: bits 0x6480 + q encode 1152 + q for q in [-128, 127]
        return (w.to(tl.int16) + 0x6480).to(tl.float16, bitcast=True) - 1152.0
    else:
        return w.to(DTYPE)


@triton.jit
def _matmul_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym, has_bias,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, W_INT8: tl.constexpr,
):
    # Grouped launch order: GROUP_M row tiles share each weight column tile while it is in L2.
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    group_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % group_m
    pid_n = (pid % group) // group_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    rm_ld = rm % M  # out-of-range rows/cols read valid memory; their results are never stored
    rn_ld = rn % N
    x_ptrs = x_ptr + rm_ld[:, None] * stride_xm + rk[None, :]  # (BLOCK_M, BLOCK_K)
    w_ptrs = w_ptr + rn_ld[None, :] * stride_wn + rk[:, None]  # (BLOCK_K, BLOCK_N): W^T tile
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(x_ptrs, mask=rk[None, :] < k_left, other=0.0)
        b = tl.load(w_ptrs, mask=rk[:, None] < k_left, other=0)
        if W_INT8:
            b = _int8_to_act(b, x_ptr.dtype.element_ty)
        acc = tl.dot(a, b, acc, input_precision="ieee")
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if W_INT8:
        acc = acc * tl.load(s_ptr + rn_ld)[None, :]
    if has_bias != 0:
        acc = acc + tl.load(b_ptr + rn_ld).to(tl.float32)[None, :]
    y_ptrs = y_ptr + rm[:, None] * stride_ym + rn[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym, has_bias,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, W_INT8: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    rn_ld = rn % N
    rm_ld = rm % M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = kb * BLOCK_K
        kmask = (k0 + rk) < K
        w = tl.load(w_ptr + rn_ld[:, None] * stride_wn + (k0 + rk)[None, :], mask=kmask[None, :], other=0)  # (BN, BK)
        if W_INT8:
            w = _int8_to_act(w, x_ptr.dtype.element_ty)
        x = tl.load(x_ptr + rm_ld[:, None] * stride_xm + (k0 + rk)[None, :], mask=kmask[None, :], other=0.0)  # (BM, BK)
        # exact FP32 products (11-bit x 8-bit mantissas), FP32 sums
        acc += tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)  # (BM, BN)
    if W_INT8:
        acc = acc * tl.load(s_ptr + rn_ld)[None, :]
    if has_bias != 0:
        acc = acc + tl.load(b_ptr + rn_ld).to(tl.float32)[None, :]
    y_ptrs = y_ptr + rm[:, None] * stride_ym + rn[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _quantize_rows_kernel(x_ptr, smooth_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, has_smooth, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = kb * BLOCK_K
        mask = (k0 + rk) < K
        x = tl.load(x_ptr + row * stride_xm + k0 + rk, mask=mask, other=0.0).to(tl.float32)
        if has_smooth != 0:
            x = tl.math.div_rn(x, tl.load(smooth_ptr + k0 + rk, mask=mask, other=1.0))
        amax = tl.maximum(amax, tl.abs(x))
    row_max = tl.max(amax, axis=0)
    # correctly rounded divisions (Triton's `/` is the approximate div.full.f32): the same int8 values as torch
    scale = tl.where(row_max > 0, tl.math.div_rn(row_max, 127.0), 1.0)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = kb * BLOCK_K
        mask = (k0 + rk) < K
        x = tl.load(x_ptr + row * stride_xm + k0 + rk, mask=mask, other=0.0).to(tl.float32)
        if has_smooth != 0:
            x = tl.math.div_rn(x, tl.load(smooth_ptr + k0 + rk, mask=mask, other=1.0))
        v = tl.math.div_rn(x, scale)
        v = (v + 12582912.0) - 12582912.0  # round half to even (|v| <= 127 << 2^22), as torch.round
        v = tl.minimum(tl.maximum(v, -127.0), 127.0)
        tl.store(q_ptr + row * stride_qm + k0 + rk, v.to(tl.int8), mask=mask)
    tl.store(s_ptr + row, scale)


@triton.jit
def _w8a8_kernel(
    xq_ptr, sx_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym, has_bias,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    group_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % group_m
    pid_n = (pid % group) // group_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    rm_ld = rm % M
    rn_ld = rn % N
    x_ptrs = xq_ptr + rm_ld[:, None] * stride_xm + rk[None, :]  # (BLOCK_M, BLOCK_K) int8
    w_ptrs = w_ptr + rn_ld[None, :] * stride_wn + rk[:, None]  # (BLOCK_K, BLOCK_N) int8
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(x_ptrs, mask=rk[None, :] < k_left, other=0)
        b = tl.load(w_ptrs, mask=rk[:, None] < k_left, other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)  # exact for K < 2^17
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    y = acc.to(tl.float32) * tl.load(sx_ptr + rm_ld)[:, None] * tl.load(s_ptr + rn_ld)[None, :]
    if has_bias != 0:
        y = y + tl.load(b_ptr + rn_ld).to(tl.float32)[None, :]
    y_ptrs = y_ptr + rm[:, None] * stride_ym + rn[None, :]
    tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


# --------------------------------------------------------------------------- parameters and spaces
def _mm_params(w_type: str, scale_value) -> tuple[Param, ...]:
    return (
        Param("x_ptr", "*act", ptr("x")),
        Param("w_ptr", w_type, ptr("weight")),
        Param("s_ptr", "*fp32", scale_value),
        Param("b_ptr", "*act", ptr("bias")),
        Param("y_ptr", "*act", ptr("y")),
        Param("M", "i32", shape("x", 0)),
        Param("N", "i32", shape("weight", 0)),
        Param("K", "i32", shape("x", 1), div16=True),
        Param("stride_xm", "i32", stride("x", 0), div16=True),
        Param("stride_wn", "i32", stride("weight", 0), div16=True),
        Param("stride_ym", "i32", stride("y", 0), div16=True),
        Param("has_bias", "i32", {"present": "bias"}),
    )


def _gemm_space(s: dict) -> list:
    m = int(s.get("rows", s.get("M", 256)))
    bms = (16, 32) if m <= 16 else (32, 64, 128)
    return [
        ({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, w, st)
        for bm in bms for bn in (32, 64, 128, 256) for bk in (32, 64, 128)
        for w in (4, 8) for st in (2, 3, 4)
        if not (bm * bn >= 128 * 256 and w == 4)
    ]


def _gemm_default(s: dict):
    m = int(s.get("rows", s.get("M", 256)))
    if m <= 16:
        return {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8}, 4, 4
    if m <= 64:
        return {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}, 4, 4
    return {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, 8, 3


def _gemm_smem(w_bytes: int):
    def est(c, warps, stages, nbytes):
        # pipelined operand tiles; the epilogue's layout conversion reuses the same memory
        # Triton keeps (stages - 1) operand tiles in flight; the epilogue reuses the same memory
        pipe = max(1, stages - 1) * (c["BLOCK_M"] * c["BLOCK_K"] * nbytes + c["BLOCK_K"] * c["BLOCK_N"] * w_bytes)
        return max(pipe, c["BLOCK_M"] * c["BLOCK_N"] * 4 // max(1, warps // 4))

    return est


def _gemv_block_m(s: dict) -> int:
    return pow2_at_least(max(1, min(GEMV_MAX_ROWS, int(s.get("rows", s.get("M", 1))))))


def _gemv_space(s: dict) -> list:
    bm = _gemv_block_m(s)
    # the (BM, BN, BK) FP32 product is reduced every step: at most 64 values per thread
    return [
        ({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, w, st)
        for bn in (2, 4, 8, 16, 32) for bk in (128, 256, 512, 1024, 2048) for w in (2, 4, 8) for st in (1, 3)
        if bm * bn * bk <= 64 * 32 * w and bn * bk >= 16 * 32 * w
    ]


def _gemv_default(s: dict):
    bm = _gemv_block_m(s)
    if bm == 1:  # measured best on the H200 (llama-3.1-8b w_gate_up, 1x4096 @ 4096x28672): 8 x 1024, 4 warps
        return {"BLOCK_M": 1, "BLOCK_N": 8, "BLOCK_K": 1024}, 4, 1
    bn = 8 if bm <= 2 else 4
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": max(128, min(1024, 8192 // (bm * bn)))}, 4, 1


def _defs(op: str, prefix: str, w_type: str, w_int8: int, scale_value) -> tuple[KernelDef, KernelDef]:
    w_name = "int8 weights" if w_int8 else "{act} weights"
    prec = {"input": "{act} activations, " + w_name + (" + fp32 per-channel scale" if w_int8 else ""),
            "accumulate": "fp32", "output": "{act}"}
    gemm = KernelDef(
        op=op, kernel=f"{prefix}_gemm", fn=_matmul_kernel, params=_mm_params(w_type, scale_value),
        constexpr_names=("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "W_INT8"), precision=prec,
        uses_shared_memory=True, space=_gemm_space, default=_gemm_default,
        smem_estimate=_gemm_smem(1 if w_int8 else 2), fixed={"W_INT8": w_int8},
    )
    gemv = KernelDef(
        op=op, kernel=f"{prefix}_gemv", fn=_gemv_kernel, params=_mm_params(w_type, scale_value),
        constexpr_names=("BLOCK_M", "BLOCK_N", "BLOCK_K", "W_INT8"), precision=prec,
        # the cross-thread reduction over BLOCK_K goes through shared memory (measured 0.1-8 KB on sm_87/90)
        uses_shared_memory=True, space=_gemv_space, default=_gemv_default,
        smem_estimate=lambda c, warps, stages, nbytes: 4096 if c["BLOCK_M"] == 1 else
        max(4096, c["BLOCK_M"] * c["BLOCK_N"] * c["BLOCK_K"]) * max(1, stages - 1),
        fixed={"W_INT8": w_int8},
    )
    return gemv, gemm


LINEAR_GEMV, LINEAR_GEMM = _defs("linear", "linear", "*act", 0, 0)
W8A16_GEMV, W8A16_GEMM = _defs("linear_w8a16", "w8a16", "*i8", 1, ptr("scale"))

W8A8_QUANTIZE = KernelDef(
    op="linear_w8a8", kernel="w8a8_quantize", fn=_quantize_rows_kernel,
    params=(
        Param("x_ptr", "*act", ptr("x")),
        Param("smooth_ptr", "*fp32", ptr("smooth")),
        Param("q_ptr", "*i8", ptr("xq")),
        Param("s_ptr", "*fp32", ptr("sx")),
        Param("K", "i32", shape("x", 1), div16=True),
        Param("stride_xm", "i32", stride("x", 0), div16=True),
        Param("stride_qm", "i32", stride("xq", 0), div16=True),
        Param("has_smooth", "i32", {"present": "smooth"}),
    ),
    constexpr_names=("BLOCK_K",),
    precision={"input": "{act} (/ fp32 smooth)", "accumulate": "fp32 (row max)", "output": "int8 + fp32 row scale"},
    uses_shared_memory=False,
    space=lambda s: [({"BLOCK_K": b}, w, 1) for b in (512, 1024, 2048, 4096) for w in (2, 4, 8) if b >= 128 * w],
    default=lambda s: ({"BLOCK_K": 1024}, 4, 1),
    smem_estimate=lambda c, warps, stages, nbytes: 4 * warps,
)

W8A8_GEMM = KernelDef(
    op="linear_w8a8", kernel="w8a8_gemm", fn=_w8a8_kernel,
    params=(
        Param("xq_ptr", "*i8", ptr("xq")),
        Param("sx_ptr", "*fp32", ptr("sx")),
        Param("w_ptr", "*i8", ptr("weight")),
        Param("s_ptr", "*fp32", ptr("scale")),
        Param("b_ptr", "*act", ptr("bias")),
        Param("y_ptr", "*act", ptr("y")),
        Param("M", "i32", shape("x", 0)),
        Param("N", "i32", shape("weight", 0)),
        Param("K", "i32", shape("x", 1), div16=True),
        Param("stride_xm", "i32", stride("xq", 0), div16=True),
        Param("stride_wn", "i32", stride("weight", 0), div16=True),
        Param("stride_ym", "i32", stride("y", 0), div16=True),
        Param("has_bias", "i32", {"present": "bias"}),
    ),
    constexpr_names=("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"),
    precision={"input": "int8 x int8 (+ fp32 token and channel scales)", "accumulate": "int32", "output": "{act}"},
    uses_shared_memory=True,
    space=lambda s: [c for c in _gemm_space(s) if c[0]["BLOCK_K"] >= 64],
    default=lambda s: ({**_gemm_default(s)[0], "BLOCK_K": 128}, *_gemm_default(s)[1:]),
    smem_estimate=lambda c, warps, stages, nbytes: _gemm_smem(1)(c, warps, stages, 1),
)


# --------------------------------------------------------------------------- programs
def _mm_launches(variants, gemv: KernelDef, gemm: KernelDef) -> list[dict]:
    v_gemv, v_gemm = variants.get(gemv.kernel), variants.get(gemm.kernel)
    M, N = shape("x", 0), shape("weight", 0)
    launches = []
    if v_gemv is not None:
        c = v_gemv.constexprs
        grid = [cdiv(N, c["BLOCK_N"]), cdiv(M, c["BLOCK_M"]), 1]
        when = {"cmp": "le", "a": M, "b": c["BLOCK_M"]} if v_gemm is not None else None
        launches.append(launch_of(gemv, grid, when))
    if v_gemm is not None:
        c = v_gemm.constexprs
        grid = [mul(cdiv(M, c["BLOCK_M"]), cdiv(N, c["BLOCK_N"])), 1, 1]
        when = {"cmp": "gt", "a": M, "b": v_gemv.constexprs["BLOCK_M"]} if v_gemv is not None else None
        launches.append(launch_of(gemm, grid, when))
    if not launches:
        raise OperatorError(f"{gemv.op}: no variant given for {gemv.kernel} or {gemm.kernel}")
    return launches


def _mm_program(op: str, inputs: list[str], optional: list[str], variants, gemv: KernelDef, gemm: KernelDef) -> dict:
    return program_doc(
        op, inputs, optional, [],
        checks=[check("eq", shape("weight", 1), shape("x", 1), "weight (N, K) must match x (M, K)")],
        let=[],
        buffers=[{"name": "y", "shape": [shape("x", 0), shape("weight", 0)], "dtype": {"like": "x"}}],
        launches=_mm_launches(variants, gemv, gemm),
        outputs=["y"],
    )


def linear_program(variants) -> dict:
    return _mm_program("linear", ["x", "weight", "bias"], ["bias"], variants, LINEAR_GEMV, LINEAR_GEMM)


def w8a16_program(variants) -> dict:
    return _mm_program("linear_w8a16", ["x", "weight", "scale", "bias"], ["bias"], variants, W8A16_GEMV, W8A16_GEMM)


def w8a8_program(variants) -> dict:
    vq, vg = variants["w8a8_quantize"], variants["w8a8_gemm"]
    M, N, K = shape("x", 0), shape("weight", 0), shape("x", 1)
    c = vg.constexprs
    return program_doc(
        "linear_w8a8", ["x", "weight", "scale", "bias", "smooth"], ["bias", "smooth"], [],
        checks=[check("eq", shape("weight", 1), K, "weight (N, K) must match x (M, K)")],
        let=[],
        buffers=[
            {"name": "xq", "shape": [M, K], "dtype": "i8"},
            {"name": "sx", "shape": [M], "dtype": "fp32"},
            {"name": "y", "shape": [M, N], "dtype": {"like": "x"}},
        ],
        launches=[
            launch_of(W8A8_QUANTIZE, [M, 1, 1]),
            launch_of(W8A8_GEMM, [mul(cdiv(M, c["BLOCK_M"]), cdiv(N, c["BLOCK_N"])), 1, 1]),
        ],
        outputs=["y"],
    )


# --------------------------------------------------------------------------- host-side checks
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


LINEAR_OP = OpKernels("linear", (LINEAR_GEMV, LINEAR_GEMM), linear_program, prepare_linear,
                      required=(("linear_gemv", "linear_gemm"),))
W8A16_OP = OpKernels("linear_w8a16", (W8A16_GEMV, W8A16_GEMM), w8a16_program, prepare_w8a16,
                     required=(("w8a16_gemv", "w8a16_gemm"),))
W8A8_OP = OpKernels("linear_w8a8", (W8A8_QUANTIZE, W8A8_GEMM), w8a8_program, prepare_w8a8,
                    required=(("w8a8_quantize",), ("w8a8_gemm",)))
