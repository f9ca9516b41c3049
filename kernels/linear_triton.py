"""Linear layers as Triton kernels: FP16 weights, INT8 weight-only (W8A16) and INT8 x INT8 (W8A8).

References: ``kernels/linear.py``. Four kernels:

- ``_matmul_kernel``: tiled GEMM on tensor cores (``tl.dot``, FP32 accumulation,
  ``input_precision="ieee"`` so FP32 inputs never silently become TF32). With
  ``W_INT8`` the weight tile is loaded as INT8 (half the bytes of FP16) and
  dequantised in registers; the per-output-channel scale is applied once to
  the accumulator, which is exact algebra: (x @ q.T) * s.
- ``_gemv_kernel``: the decode path (one row per program). A GEMV is bound by
  reading the weights once. Each thread keeps FP32 partial sums (one per
  16-weight run it owns) across the whole K loop (exact FP32 products with
  FMAs, no tensor cores) and the threads reduce once at the end. When the
  (N, row) tiles alone cannot fill the device, K is split across programs
  (split-K): each writes its FP32 partials and a second launch of the same
  kernel sums them in split order (deterministic) and applies the epilogue.
- ``_quantize_rows_kernel``: W8A8's per-token dynamic activation quantisation
  (optional SmoothQuant divisor), rounding half to even like ``torch.round``.
- ``_w8a8_kernel``: INT8 x INT8 ``tl.dot`` into INT32, scaled by the token and
  channel scales in FP32.

INT8 -> FP16 dequantisation (GEMM) uses the exponent trick instead of the
int-to-float unit (a quarter-rate unit that would cap a kernel below memory
bandwidth): the FP16 with bits 0x6400 + m is 1024 + m for an integer m < 1024,
so q + 128 placed in the mantissa, minus 1152, is q exactly. The GEMV converts
straight to FP32 in inline PTX (``_int8_to_f32``: one XOR per 4 weights, then a
PRMT and a subtraction per weight: 2^23 + q + 128 - (2^23 + 128) = q exactly).

Measured on the H200 (tools/gemv_lab.py, M=1, llama-3.1-8b w_gate_up, 117 MB of
INT8, CUDA-graph replay): the earlier GEMV that reduced its (BN, BK) product
across threads every K step ran at 46 us (60% of copy bandwidth; its SASS spent
~7.6 instructions a weight on shuffles, shared-memory round trips, barriers and
conversions); per-thread partials with the PTX conversion: 32.4-33.3 us (83-86%
of copy bandwidth over four runs); one partial per 16 weights (fewer registers,
more loads in flight): 29.5 us (94%); fp16 F.linear 55-58 us. Tensor cores (weights
as the A operand, x padded to 16 rows) reached 32.4 us but lose accuracy at long
K (relative error 7.6e-3 at K = 14336 vs 4.8e-4 for FMA), so the one-row GEMV
stays on FMAs; decode batches of 2+ rows take the tensor-core GEMM (38 us for 4
or 8 rows of that shape; max |err| / (|ref| + 0.01) up to 1.5e-2 at K = 14336, as
FP32-accumulating MMAs give).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from edgekit.errors import OperatorError
from edgekit.kernels.kernel_def import KernelDef, OpKernels, Param, launch_of, program_doc
from edgekit.kernels.launch_rule import cdiv, check, mul, ptr, shape, stride, sym
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.linear import prepare_linear, prepare_w8a16, prepare_w8a8

# Decode calls of this many rows take the GEMV kernel when both are planned; more rows take the tensor-core
# GEMM. Measured on the H200 (tools/gemv_lab.py --production): FP32-FMA GEMVs over 4-8 rows (per-row
# accumulators) ran 3.6-8x slower than one row (3-D accumulators or per-row copies made Triton move x through
# shared memory every step), slower than the GEMM, so the GEMV is a one-row kernel.
GEMV_MAX_ROWS = 1
# Split-K until the GEMV has this many programs per SM, with at least GEMV_SPLIT_MIN_BLOCKS K blocks per split
# (a split's partials cost a second launch, ~2 us: more than a small GEMV saves). Measured on the H200
# (tools/gemv_lab.py --production): 4 per SM vs 8/16 was equal or up to 11% faster on 1.5B-8B shapes.
GEMV_PROGRAMS_PER_SM = 4
GEMV_SPLIT_MIN_BLOCKS = 4

# Inline PTX is compiled code: Triton's CPU interpreter (TRITON_INTERPRET=1, read by Triton at import as here)
# cannot run it and takes the plain conversion instead, which gives the same (exact) values.
_PTX_DEQUANT = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1")


@triton.jit
def _int8_to_act(w, DTYPE: tl.constexpr):
    if DTYPE == tl.float16:
        # exact: bits 0x6480 + q encode 1152 + q for q in [-128, 127]
        return (w.to(tl.int16) + 0x6480).to(tl.float16, bitcast=True) - 1152.0
    else:
        return w.to(DTYPE)


@triton.jit
def _grouped_tile(x_ptr, w_ptr, M, N, stride_xm, stride_wn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's (BLOCK_M, BLOCK_N) output tile of x @ W^T and its first operand tiles.

    Grouped launch order: GROUP_M row tiles share each weight column tile while it is in L2. Rows and columns
    past M / N load valid memory (index modulo the size); their results are never stored.
    """
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
    x_ptrs = x_ptr + (rm % M)[:, None] * stride_xm + rk[None, :]  # (BLOCK_M, BLOCK_K)
    w_ptrs = w_ptr + (rn % N)[None, :] * stride_wn + rk[:, None]  # (BLOCK_K, BLOCK_N): W^T tile
    return rm, rn, rk, x_ptrs, w_ptrs


@triton.jit
def _matmul_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym, has_bias,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, W_INT8: tl.constexpr,
):
    rm, rn, rk, x_ptrs, w_ptrs = _grouped_tile(x_ptr, w_ptr, M, N, stride_xm, stride_wn,
                                               BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    rn_ld = rn % N
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
def _int8_to_f32(w):
    if _PTX_DEQUANT:
        # 4 INT8 per register: q ^ 0x80 = q + 128 becomes the low byte of 0x4B000000 (2^23 + q + 128),
        # minus 2^23 + 128 is q exactly. ~2.3 instructions a weight instead of the int-to-float unit's quarter rate.
        return tl.inline_asm_elementwise(
            asm="{ .reg .b32 u, e; xor.b32 u, $4, 0x80808080; mov.b32 e, 0x4B000000;"
                " prmt.b32 $0, u, e, 0x7650; prmt.b32 $1, u, e, 0x7651;"
                " prmt.b32 $2, u, e, 0x7652; prmt.b32 $3, u, e, 0x7653;"
                " sub.f32 $0, $0, 0f4B000080; sub.f32 $1, $1, 0f4B000080;"
                " sub.f32 $2, $2, 0f4B000080; sub.f32 $3, $3, 0f4B000080; }",
            constraints="=f,=f,=f,=f,r", args=[w], dtype=tl.float32, is_pure=True, pack=4)
    else:
        return w.to(tl.float32)


@triton.jit
def _split_k_blocks(K, BLOCK_K: tl.constexpr, num_splits, pid_s):
    """The K blocks [first, last) that split ``pid_s`` of a split-K GEMV reduces (equal shares, the last shorter)."""
    n_blocks = tl.cdiv(K, BLOCK_K)
    per = tl.cdiv(n_blocks, num_splits)
    first = pid_s * per
    return first, tl.minimum(n_blocks, first + per)


@triton.jit
def _split_k_sum(part_ptr, num_splits, M, N, row, rn_ld, BLOCK_N: tl.constexpr):
    """The second launch of a split-K GEMV: the FP32 partials summed in split order (the same result every run)."""
    y = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for sp in range(0, num_splits):
        y += tl.load(part_ptr + (sp * M + row) * N + rn_ld)
    return y


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, part_ptr, M, N, K, stride_xm, stride_wn, stride_ym, has_bias,
    num_splits, reduce_splits,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, W_INT8: tl.constexpr,
):
    # One activation row per program (BLOCK_M is 1; GEMV_MAX_ROWS says why).
    tl.static_assert(BLOCK_M == 1)
    pid_n = tl.program_id(0)
    row = tl.program_id(1)
    pid_s = tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_ld = rn % N
    mask = rn < N
    if reduce_splits != 0:
        y = _split_k_sum(part_ptr, num_splits, M, N, row, rn_ld, BLOCK_N)
    else:
        # this program's share of the K blocks: FP32 partials per thread across the loop, exact FP32 products
        # (11-bit x 8-bit or 11-bit x 11-bit mantissas), reduced across threads once at the end
        rk = tl.arange(0, BLOCK_K)
        first, last = _split_k_blocks(K, BLOCK_K, num_splits, pid_s)
        w_rows = w_ptr + rn_ld[:, None] * stride_wn
        # one FP32 partial per 16-weight run a thread owns (not per weight): 16x fewer accumulator registers,
        # so more loads stay in flight (measured: 94% vs 85% of copy bandwidth)
        acc = tl.zeros((BLOCK_N, BLOCK_K // 16), dtype=tl.float32)
        for kb in range(first, last):
            k = kb * BLOCK_K + rk
            kmask = k < K
            w = tl.load(w_rows + k[None, :], mask=kmask[None, :], other=0)  # (BN, BK)
            x = tl.load(x_ptr + row * stride_xm + k, mask=kmask, other=0.0)  # (BK,)
            if W_INT8:
                wf = _int8_to_f32(w)
            else:
                wf = w.to(tl.float32)
            prod = wf * x.to(tl.float32)[None, :]
            acc += tl.sum(tl.reshape(prod, (BLOCK_N, BLOCK_K // 16, 16)), axis=2)
        y = tl.sum(acc, axis=1)
    if (reduce_splits == 0) & (num_splits > 1):
        tl.store(part_ptr + (pid_s * M + row) * N + rn, y, mask=mask)  # split-K partials: (splits, M, N) FP32
    else:
        if W_INT8:
            y = y * tl.load(s_ptr + rn_ld)
        if has_bias != 0:
            y = y + tl.load(b_ptr + rn_ld).to(tl.float32)
        tl.store(y_ptr + row * stride_ym + rn, y.to(y_ptr.dtype.element_ty), mask=mask)


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
    rm, rn, rk, x_ptrs, w_ptrs = _grouped_tile(xq_ptr, w_ptr, M, N, stride_xm, stride_wn,
                                               BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)  # int8 operand tiles
    rm_ld = rm % M
    rn_ld = rn % N
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
        *_output_and_shape_params("x"),
    )


def _output_and_shape_params(x_rows: str) -> tuple[Param, ...]:
    """The parameters after the operand pointers, shared by every linear kernel; ``x_rows`` is the tensor the
    kernel reads activation rows from (W8A8 reads the quantised copy)."""
    return (
        Param("b_ptr", "*act", ptr("bias")),
        Param("y_ptr", "*act", ptr("y")),
        Param("M", "i32", shape("x", 0)),
        Param("N", "i32", shape("weight", 0)),
        Param("K", "i32", shape("x", 1), div16=True),
        Param("stride_xm", "i32", stride(x_rows, 0), div16=True),
        Param("stride_wn", "i32", stride("weight", 0), div16=True),
        Param("stride_ym", "i32", stride("y", 0), div16=True),
        Param("has_bias", "i32", {"present": "bias"}),
    )


def _gemv_params(w_type: str, scale_value) -> tuple[Param, ...]:
    # reduce_splits is 0 for the main launch; the split-K reduce launch passes 1 (_mm_launches)
    mm = _mm_params(w_type, scale_value)
    return (*mm[:5], Param("part_ptr", "*fp32", ptr("part")), *mm[5:],
            Param("num_splits", "i32", sym("NUM_SPLITS")), Param("reduce_splits", "i32", 0))


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


def _gemv_space(s: dict) -> list:
    # each thread streams 16-128 weights a step (128-bit INT8 loads); one FP32 partial per 16 of them
    return [
        ({"BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk}, w, 1)
        for bn in (2, 4, 8, 16, 32, 64) for bk in (128, 256, 512, 1024, 2048) for w in (2, 4, 8)
        if 16 * 32 * w <= bn * bk <= 128 * 32 * w
    ]


def _gemv_default(s: dict):
    # measured on the H200 (tools/gemv_lab.py, M=1): 32 x 256 at 4 warps: 94% of copy bandwidth on 117 MB
    return {"BLOCK_M": 1, "BLOCK_N": 32, "BLOCK_K": 256}, 4, 1


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
        op=op, kernel=f"{prefix}_gemv", fn=_gemv_kernel, params=_gemv_params(w_type, scale_value),
        constexpr_names=("BLOCK_M", "BLOCK_N", "BLOCK_K", "W_INT8"), precision=prec,
        # only the final cross-thread reduction of the partials goes through shared memory (a few KB, the compiled
        # size is checked): no tile to fit to a budget, so the planner takes the measured default, as it does for the
        # fused GEMVs. Searched, it ranked the largest tile first for a reuse a batch-1 GEMV does not have (each weight
        # is read once): 32 x 1024 at 8 warps, 246 registers a thread for sm_87, in every orin bundle's linear plugin
        # and in Gemma 3's unfused down projection, where the orin plan ran 12% under the JIT default's 32 x 256 at
        # 4 warps on 16 SMs of an H100 (stop 64's `bench --sms` row, one of its two differing kernels)
        uses_shared_memory=False, space=_gemv_space, default=_gemv_default,
        smem_estimate=lambda c, warps, stages, nbytes: max(4096, 4 * c["BLOCK_N"] * warps),
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
        *_output_and_shape_params("xq"),
    ),
    constexpr_names=("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"),
    precision={"input": "int8 x int8 (+ fp32 token and channel scales)", "accumulate": "int32", "output": "{act}"},
    uses_shared_memory=True,
    space=lambda s: [c for c in _gemm_space(s) if c[0]["BLOCK_K"] >= 64],
    default=lambda s: ({**_gemm_default(s)[0], "BLOCK_K": 128}, *_gemm_default(s)[1:]),
    smem_estimate=lambda c, warps, stages, nbytes: _gemm_smem(1)(c, warps, stages, 1),
)


# --------------------------------------------------------------------------- programs
def _gemv_splits(c: dict, with_gemm: bool) -> dict:
    """Split-K factor (launch-rule expression): enough programs to fill the device, never fewer than
    GEMV_SPLIT_MIN_BLOCKS K blocks a split, and 1 when the call has more rows than the GEMV takes and a
    GEMM is planned (the GEMM runs it)."""
    M, N, K = shape("x", 0), shape("weight", 0), shape("x", 1)
    tiles = mul(cdiv(N, c["BLOCK_N"]), cdiv(M, c["BLOCK_M"]))
    wanted = cdiv(mul(GEMV_PROGRAMS_PER_SM, {"device": "sm_count"}), tiles)
    splits = {"min": [cdiv(K, c["BLOCK_K"] * GEMV_SPLIT_MIN_BLOCKS), wanted]}
    if with_gemm:
        splits = mul(splits, {"min": [1, {"floordiv": [c["BLOCK_M"], M]}]})  # x 0 when M > BLOCK_M
    return {"max": [1, splits]}


def _mm_launches(variants, gemv: KernelDef, gemm: KernelDef) -> list[dict]:
    v_gemv, v_gemm = variants.get(gemv.kernel), variants.get(gemm.kernel)
    M, N = shape("x", 0), shape("weight", 0)
    launches = []
    if v_gemv is not None:
        c = v_gemv.constexprs
        tiles = [cdiv(N, c["BLOCK_N"]), cdiv(M, c["BLOCK_M"])]
        when = {"cmp": "le", "a": M, "b": c["BLOCK_M"]} if v_gemm is not None else None
        launches.append(launch_of(gemv, [*tiles, sym("NUM_SPLITS")], when))
        # the same kernel again, summing the split-K partials (NUM_SPLITS is 1 on the GEMM path)
        reduce = launch_of(gemv, [*tiles, 1], {"cmp": "gt", "a": sym("NUM_SPLITS"), "b": 1})
        assert gemv.params[-1].name == "reduce_splits"
        reduce["args"][-1] = 1
        launches.append(reduce)
    if v_gemm is not None:
        c = v_gemm.constexprs
        grid = [mul(cdiv(M, c["BLOCK_M"]), cdiv(N, c["BLOCK_N"])), 1, 1]
        when = {"cmp": "gt", "a": M, "b": v_gemv.constexprs["BLOCK_M"]} if v_gemv is not None else None
        launches.append(launch_of(gemm, grid, when))
    if not launches:
        raise OperatorError(f"{gemv.op}: no variant given for {gemv.kernel} or {gemm.kernel}")
    return launches


def _mm_program(op: str, inputs: list[str], optional: list[str], variants, gemv: KernelDef, gemm: KernelDef) -> dict:
    M, N = shape("x", 0), shape("weight", 0)
    v_gemv = variants.get(gemv.kernel)
    splits = _gemv_splits(v_gemv.constexprs, gemm.kernel in variants) if v_gemv is not None else 1
    used = {"min": [1, {"sub": [sym("NUM_SPLITS"), 1]}]}  # 0 without split-K: an empty partials buffer
    return program_doc(
        op, inputs, optional, [],
        checks=[check("eq", shape("weight", 1), shape("x", 1), "weight (N, K) must match x (M, K)")],
        let=[["NUM_SPLITS", splits]],
        buffers=[{"name": "y", "shape": [M, N], "dtype": {"like": "x"}},
                 {"name": "part", "shape": [mul(sym("NUM_SPLITS"), used), M, N], "dtype": "fp32"}],
        launches=_mm_launches(variants, gemv, gemm),
        outputs=["y"],
    )


def linear_program(variants) -> dict:
    return _mm_program("linear", ["x", "weight", "bias"], ["bias"], variants, LINEAR_GEMV, LINEAR_GEMM)


def w8a16_program(variants) -> dict:
    return _mm_program("linear_w8a16", ["x", "weight", "scale", "bias"], ["bias"], variants, W8A16_GEMV, W8A16_GEMM)


def w8a8_program(variants) -> dict:
    M, N, K = shape("x", 0), shape("weight", 0), shape("x", 1)
    c = variants["w8a8_gemm"].constexprs
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


LINEAR_OP = OpKernels("linear", (LINEAR_GEMV, LINEAR_GEMM), linear_program, prepare_linear,
                      required=(("linear_gemv", "linear_gemm"),))
W8A16_OP = OpKernels("linear_w8a16", (W8A16_GEMV, W8A16_GEMM), w8a16_program, prepare_w8a16,
                     required=(("w8a16_gemv", "w8a16_gemm"),))
W8A8_OP = OpKernels("linear_w8a8", (W8A8_QUANTIZE, W8A8_GEMM), w8a8_program, prepare_w8a8,
                    required=(("w8a8_quantize",), ("w8a8_gemm",)))
