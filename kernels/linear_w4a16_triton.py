"""INT4 weight-only linear (W4A16) as Triton kernels: a GEMV for decode and a tensor-core GEMM for prefill.

Reference: ``kernels/linear.py`` (``linear_w4a16_reference``); layout: ``kernels/int4_layout.py``
(packed uint8 (N, K/2) in GGML's nibble order, group scales (N, K/G), optional offsets).

- ``_w4a16_gemv_kernel``: one activation row per program, ``BLOCK_N`` weight rows, ``BLOCK_K`` elements a
  step, FP32 FMAs (exact products) and one FP32 partial per 32-element sub-block: s * sum(q x) (+ offset *
  sum(x)), so group scales and offsets are applied once per 32 weights. Nibbles become floats without the
  int-to-float unit (quarter rate); ``DECODE`` picks how: 2 (default) and 1 read int32 words and make each
  byte's nibbles FP32 1 + q/256 and 1 + q/16 with one shift and one LOP3 each (``_dots_from_words``; 2 loads
  x in runs, 1 one by one); 0 reads bytes and subtracts the 2^23 magic (``_dots_from_bytes``). Split-K as in
  ``linear_triton``'s GEMV: when the (N, row) tiles cannot fill the device, K is split across programs and a
  second launch of the same kernel sums the FP32 partials in split order (deterministic).
  Measured on the H200 (bench_w4a16.py, graph replay, >= 4x L2): 39.9 us for 58.7 MB of INT4 (8B w_gate_up),
  36.7% of the copy bandwidth, 0.71x fp16 F.linear's time, slower than the W8A16 GEMV (30.0 us on twice the
  bytes). The kernel is instruction-bound: ~10 SASS instructions a weight byte (INT8's GEMV: ~4.2) at the
  ~16 G instructions/s both reach; the targets (85% of copy, 0.35x F.linear) need ~4 a byte, i.e. decoding
  packed codes to FP16 pairs and multiplying on tensor cores (mma with x as the narrow operand), not FP32 FMAs.
  ``DECODE`` 3 (FP16 activations; BF16 / FP32 ones take DECODE 2's code) is the half2 GEMV
  (``int4_half2_triton.py``): one 16-byte load a row's sub-block, nibbles to FP16 with the 0x6400 magic-number trick
  (LOP3 + HSUB2/HFMA2 in inline PTX), HFMA2 products summed in FP16 within a sub-block and in FP32 across
  them, activations loaded, paired (PRMT) and scaled once per (thread, sub-block) and shared by the 8-16
  rows a thread holds, group scales loaded in inline PTX so that they stay in the dot products' layout.
  Static count (tools/gemv_sass_report.py, sm_90 / sm_87): 5.0-5.1 SASS instructions a weight byte in the
  K loop at 16 rows a thread (~200 registers), 5.45 at 8 rows (~122), both sides of the scale-dtype branch
  included, against 9.7-9.9 for DECODE 2 (of which ~3.4 a byte is the half2 decode and products themselves).
  ``DECODE`` 4 is DECODE 3 with the next K step's words loaded before the current step's dot products.
  Measured on the H200 (bench_w4a16.py, 2026-12-01, copy 4227 GB/s), best tile each: 8B w_gate_up 58.7 MB
  24.8 us (DECODE 3, 64 x 256, 2 warps: 59.5% of copy, 0.45x fp16 F.linear; DECODE 2 40.1 us); 1B lm_head
  131 MB 42.9 us (DECODE 3, 128 x 256: 77.0%, 0.35x; DECODE 2 69.7 us); DECODE 4 is fastest on 1B w_down
  (9.6 vs 13.4 us) and w_gate_up (10.8 vs 11.2) but not on the two large shapes. Nsight Compute
  (tools/gpu_ncu_w4a16.sh) says why: every tile is latency-bound, not instruction-bound: 126-168 registers
  a thread cap occupancy at 18.75-25% (16-23% achieved), the top warp stall is the long scoreboard (2.0-3.3
  cycles an issued instruction, waiting on global loads), and DRAM throughput is 54-66% in the profiled launch.
  DECODE 4 doubles a program's bytes in flight but its 168 registers cost the same in occupancy.
  STAGES > 1 (the variant's num_stages, ``KernelDef.loop_stages``) stages the K loop's words through shared memory
  by asynchronous copies, STAGES - 1 steps ahead: bytes in flight without registers. Measured (bench_w4a16.py,
  H200, 2026-12-02, copy 4.23 TB/s): 1B lm_head 131 MB 40.9 us (64 x 256, 2 warps, 3 stages: 80.4% of copy, 0.34x
  fp16 F.linear; unstaged best 42.7); 8B w_gate_up 24.7 us (59.6%, unchanged: the half2 decode's instruction
  count bounds it there); 1B w_gate_up / w_down / wq-wo 9.2 / 8.0 / 5.8 us at 64 x 512, 4 warps, 3 stages
  (unstaged best 10.8 / 9.6 / 7.3). That tile beats DECODE 2's default on every shape (26.3 / 44.9 us on the two
  large ones against 39.9 / 69.6); the planner's default stays DECODE 2 for now: DECODE 3 sums in FP16 within a
  sub-block, so a change of default changes every bundle's per-operator INT4 numerics and needs its own accuracy
  check (the fused decode path already runs the half2 decode).
- ``_w4a16_gemm_kernel``: tiled GEMM on tensor cores. The (BK, BN) weight tile is dequantized in registers
  to the reference's FP32 weights, rounded to the activation dtype (as F.linear on dequantized weights) and
  multiplied with one ``tl.dot`` a K tile into the FP32 accumulator; the dequantization is amortised over the
  BLOCK_M rows. Measured on the H200 at 512 x 28672 x 4096 (bench_w4a16.py): 121 TF/s (128 x 64 tiles; 109 at
  128 x 128) against fp16 F.linear's 707, 5.9x its time. The first version kept exact codes in the dot and
  scaled an FP32 product per 32-element sub-block: 55 TF/s, the per-sub-block FP32 epilogue costing as much as
  the MMAs. Still to do: a decode of packed codes to FP16 pairs (LOP3 on 0x6400 magic) and a pipelined tile.

Scale dtype: scales and offsets may be FP16 or FP32. A compiled kernel's pointer types are fixed, so the
kernels take both an FP16 and an FP32 scale/offset pointer; the host step (``prepare_w4a16``) passes the call's
tensors in the slots of their dtype and null in the others, and the kernels branch on a uniform runtime flag.
One compiled variant therefore serves every GGUF Q4_0 / Q4_1 file and every calibrated bundle.
Group size: a runtime argument (``group_shift``: G = 32 << group_shift), so G = 32, 64 or 128 share variants.
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgekit.kernels.int4_half2_triton import UNSCALE, activation_pairs, load_where_used, subblock_dots_half2
from edgekit.kernels.int4_layout import SUBBLOCK
from edgekit.kernels.kernel_def import KernelDef, OpKernels, Param, program_doc
from edgekit.kernels.launch_rule import check, mul, ptr, shape, stride, sym
from edgekit.kernels.linear_triton import (_PTX_DEQUANT, _gemm_space, _gemv_splits, _mm_launches, _split_k_blocks,
                                          _split_k_sum)
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.linear import int4_weight_slots, prepare_w4a16  # noqa: F401 (re-exported)

_TWO_23 = tl.constexpr(8388608.0)  # 2^23: the FP32 whose low mantissa bits hold a small integer exactly


@triton.jit
def _dots_from_bytes(w_ptr, w_rows, x_row, sub, kmask, k0, zero, SB: tl.constexpr):
    """Per row and sub-block: sum (q - zero) x over the 32 weights, and sum x (DECODE 0).

    Loads each sub-block's 16 bytes per row; a nibble v becomes 2^23 + v as the FP32 with bits 0x4B000000 | v,
    minus (2^23 + zero): exact, without the int-to-float unit."""
    j = tl.arange(0, 16)
    b = tl.load(w_ptr + w_rows[:, None, None] + (k0 // 2 + tl.arange(0, SB) * 16)[None, :, None] + j[None, None, :],
                mask=kmask[None, :, None], other=0).to(tl.int32)  # (BN, SB, 16)
    x_lo = tl.load(x_row + sub[:, None] + j[None, :], mask=kmask[:, None], other=0.0).to(tl.float32)  # (SB, 16)
    x_hi = tl.load(x_row + sub[:, None] + 16 + j[None, :], mask=kmask[:, None], other=0.0).to(tl.float32)
    magic = _TWO_23 + zero
    lo = ((b & 15) | 0x4B000000).to(tl.float32, bitcast=True) - magic
    hi = ((b >> 4) | 0x4B000000).to(tl.float32, bitcast=True) - magic
    dot = tl.sum(lo * x_lo[None, :, :] + hi * x_hi[None, :, :], axis=2)  # (BN, SB)
    return dot, tl.sum(x_lo + x_hi, axis=1)


@triton.jit
def _nibble_units(words, SHIFT: tl.constexpr):
    """The two nibbles of byte b of each int32 word as FP32 1 + q/256 and 1 + q/16, with SHIFT = 15 - 8 b.

    One shift brings the byte's low nibble to bits 15-18 and its high nibble to bits 19-22, the top of an FP32
    mantissa under the exponent of 1.0; one and-or (a single LOP3) each then makes the float: exact, and no
    int-to-float unit. Written in PTX because ptxas does not merge the AND and the OR of two immediates."""
    if SHIFT >= 0:
        v = words << SHIFT
    else:
        v = words >> (-SHIFT)  # arithmetic shift: the sign bits it brings in are masked off
    if _PTX_DEQUANT:
        f_lo = tl.inline_asm_elementwise(asm="lop3.b32 $0, $1, 0x00078000, 0x3F800000, 0xEA;", constraints="=r,r",
                                         args=[v], dtype=tl.int32, is_pure=True, pack=1)
        f_hi = tl.inline_asm_elementwise(asm="lop3.b32 $0, $1, 0x00780000, 0x3F800000, 0xEA;", constraints="=r,r",
                                         args=[v], dtype=tl.int32, is_pure=True, pack=1)
    else:
        f_lo = (v & 0x00078000) | 0x3F800000
        f_hi = (v & 0x00780000) | 0x3F800000
    return f_lo.to(tl.float32, bitcast=True), f_hi.to(tl.float32, bitcast=True)


@triton.jit
def _dots_from_words(w_ptr, w_rows, x_row, k0, K, zero, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     X_RUNS: tl.constexpr):
    """The same sums as ``_dots_from_bytes`` (DECODE 1 and 2), from a (rows, BLOCK_K / 8) tile of int32 words.

    Word i of a sub-block holds bytes 4i..4i+3; byte b's low nibble is element 4i + b, its high nibble element
    16 + 4i + b. Low nibbles become f = 1 + q/256, high ones f = 1 + q/16 (``_nibble_units``), so the FMAs take
    f directly: sum q x = 256 (sum f x - sum x) over the low half plus 16 (sum f x - sum x) over the high half,
    about 2.5 instructions a weight instead of 4. Products are exact; the cancellation costs the low half's
    sums about 8 bits of FP32 (relative error ~1e-6 of the sub-block's sum, far inside the tolerance)."""
    SB: tl.constexpr = BLOCK_K // 32
    W: tl.constexpr = BLOCK_K // 8
    wi = tl.arange(0, W)
    live = k0 + (wi // 4) * 32 < K  # (W,) K is a multiple of 32: a sub-block is wholly in or out
    words = tl.load(w_ptr.to(tl.pointer_type(tl.int32)) + (w_rows // 4)[:, None] + (k0 // 8 + wi)[None, :],
                    mask=live[None, :], other=0)  # (BN, W)
    x_at = x_row + k0 + (wi // 4) * 32 + 4 * (wi % 4)  # (W,) element 4i of each word's sub-block
    if X_RUNS:
        # the 4 activations of each word's low and high nibbles as contiguous runs (vector loads), taken apart
        # per byte with register splits: x_b[i] = x[4i + b] (+ 16 for the high nibbles). Triton moves them into
        # the weight tile's layout through shared memory (a barrier a step): fewer loads, a round trip.
        four = tl.arange(0, 4)
        x_lo4 = tl.load(x_at[:, None] + four[None, :], mask=live[:, None], other=0.0).to(tl.float32)  # (W, 4)
        x_hi4 = tl.load(x_at[:, None] + 16 + four[None, :], mask=live[:, None], other=0.0).to(tl.float32)
        lo02, lo13 = tl.split(tl.reshape(x_lo4, (W, 2, 2)))
        lo0, lo2 = tl.split(lo02)
        lo1, lo3 = tl.split(lo13)
        hi02, hi13 = tl.split(tl.reshape(x_hi4, (W, 2, 2)))
        hi0, hi2 = tl.split(hi02)
        hi1, hi3 = tl.split(hi13)
        xs_lo = tl.sum(x_lo4, axis=1)  # (W,)
        xs_hi = tl.sum(x_hi4, axis=1)
    else:
        # one activation per load, straight into the layout the products need (no shared memory)
        lo0 = tl.load(x_at, mask=live, other=0.0).to(tl.float32)
        lo1 = tl.load(x_at + 1, mask=live, other=0.0).to(tl.float32)
        lo2 = tl.load(x_at + 2, mask=live, other=0.0).to(tl.float32)
        lo3 = tl.load(x_at + 3, mask=live, other=0.0).to(tl.float32)
        hi0 = tl.load(x_at + 16, mask=live, other=0.0).to(tl.float32)
        hi1 = tl.load(x_at + 17, mask=live, other=0.0).to(tl.float32)
        hi2 = tl.load(x_at + 18, mask=live, other=0.0).to(tl.float32)
        hi3 = tl.load(x_at + 19, mask=live, other=0.0).to(tl.float32)
        xs_lo = (lo0 + lo1) + (lo2 + lo3)
        xs_hi = (hi0 + hi1) + (hi2 + hi3)
    return _word_dots(words, lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3, xs_lo, xs_hi, zero, BLOCK_N, SB)


@triton.jit
def _word_dots(words, lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3, xs_lo, xs_hi, zero, BLOCK_N: tl.constexpr,
               SB: tl.constexpr):
    """The word decode's sums (``_dots_from_words``) from a (rows, W) tile of int32 words and the activations each
    byte of a word multiplies, as FP32 (W,) vectors: ``lo b`` / ``hi b`` = x[4i + b] / x[16 + 4i + b] of word i's
    sub-block, ``xs_lo`` / ``xs_hi`` their sums per word. Returns (dot (BN, SB), x_sum (SB,)). Shared with the fused
    decode GEMVs (kernels/fused_gemv_triton.py), whose activations are computed in registers, not loaded."""
    f_lo, f_hi = _nibble_units(words, 15)
    t_lo = f_lo * lo0[None, :]
    t_hi = f_hi * hi0[None, :]
    f_lo, f_hi = _nibble_units(words, 7)
    t_lo += f_lo * lo1[None, :]
    t_hi += f_hi * hi1[None, :]
    f_lo, f_hi = _nibble_units(words, -1)
    t_lo += f_lo * lo2[None, :]
    t_hi += f_hi * hi2[None, :]
    f_lo, f_hi = _nibble_units(words, -9)
    t_lo += f_lo * lo3[None, :]
    t_hi += f_hi * hi3[None, :]
    sum_lo = tl.sum(tl.reshape(t_lo, (BLOCK_N, SB, 4)), axis=2)  # (BN, SB)
    sum_hi = tl.sum(tl.reshape(t_hi, (BLOCK_N, SB, 4)), axis=2)
    x_lo_sb = tl.sum(tl.reshape(xs_lo, (SB, 4)), axis=1)  # (SB,)
    x_hi_sb = tl.sum(tl.reshape(xs_hi, (SB, 4)), axis=1)
    x_sum = x_lo_sb + x_hi_sb
    dot = 256.0 * (sum_lo - x_lo_sb[None, :]) + 16.0 * (sum_hi - x_hi_sb[None, :]) - zero * x_sum[None, :]
    return dot, x_sum


@triton.jit
def _dots_half2(w_ptr, w_rows, x_row, k0, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The sums of ``_dots_from_bytes`` (DECODE 3, FP16 activations), both scaled by 1/16 (``int4_half2_triton``).

    Each row's sub-block is one 16-byte load (four int32 words); the activations of each sub-block are loaded,
    pre-scaled and paired once per step and shared by every row a thread holds. Unlike the other decodes the dot
    is sum (q - 8) x / 16 for both forms (the caller moves the asymmetric form's 8 s into its offset)."""
    words = _half2_words(w_ptr, w_rows, k0, K, BLOCK_N, BLOCK_K)
    return _dots_half2_of(words, x_row, k0, K, BLOCK_N, BLOCK_K)


@triton.jit
def _half2_words(w_ptr, w_rows, k0, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The (BN, SB, 4) int32 words of the rows' sub-blocks in the K step at k0 (those past K: the last one's)."""
    SB: tl.constexpr = BLOCK_K // 32
    wi = tl.arange(0, 4 * SB)  # a 2-D tile, so that Triton sees the row's words as one contiguous run
    # sub-blocks past K re-read the last one instead of being masked (no predicated loads to zero-fill): their
    # activations load as 0, so they add nothing; the hints keep each sub-block's 4 words one 16-byte load
    w_col = tl.minimum(k0 // 32 + wi // 4, K // 32 - 1) * 4 + wi % 4
    w_col = tl.max_contiguous(tl.multiple_of(w_col, 4), 4)
    words = tl.load(w_ptr.to(tl.pointer_type(tl.int32)) + (w_rows // 4)[:, None] + w_col[None, :])  # (BN, 4 SB)
    return tl.reshape(words, (BLOCK_N, SB, 4))


@triton.jit
def _dots_half2_of(words, x_row, k0, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``_dots_half2`` on loaded words (``_half2_words``)."""
    SB: tl.constexpr = BLOCK_K // 32
    sb = tl.arange(0, SB)
    live = k0 + sb * 32 < K  # (SB,)
    x_words = x_row.to(tl.pointer_type(tl.int32))
    pairs, x_sum = activation_pairs(x_words, k0 // 2 + sb * 16, live)  # 16 x (SB,), (SB,)
    dot = subblock_dots_half2(words, pairs)  # (BN, SB)
    return dot, x_sum


@triton.jit
def _group_params(sh_ptr, oh_ptr, sf_ptr, of_ptr, idx, scale_f32, has_offset):
    """Scales and offsets at ``idx`` (FP16 or FP32 storage, chosen by a uniform runtime flag) as FP32;
    the offset is 0 for the symmetric form (its -8 is taken out of the codes instead)."""
    if scale_f32 != 0:
        s = tl.load(sf_ptr + idx)
        if has_offset != 0:
            m = tl.load(of_ptr + idx)
        else:
            m = tl.zeros_like(s)
    else:
        s = tl.load(sh_ptr + idx).to(tl.float32)
        if has_offset != 0:
            m = tl.load(oh_ptr + idx).to(tl.float32)
        else:
            m = tl.zeros_like(s)
    return s, m


@triton.jit
def _scale_rows(sh_ptr, oh_ptr, sf_ptr, of_ptr, s_rows, scale_f32, has_offset):
    """Byte pointers (BN, 1) to each row's first scale and offset (the scale's when there is none) and the
    bytes a scale takes: the half2 GEMV's steps add (group x bytes) to them, one 64-bit add a load."""
    if scale_f32 != 0:
        s_at, m_at = _byte_rows(sf_ptr, of_ptr, s_rows, has_offset, 4)
        nbytes = 4
    else:
        s_at, m_at = _byte_rows(sh_ptr, oh_ptr, s_rows, has_offset, 2)
        nbytes = 2
    return s_at, m_at, nbytes


@triton.jit
def _byte_rows(s_ptr, m_ptr, s_rows, has_offset, NBYTES: tl.constexpr):
    s_at = s_ptr.to(tl.pointer_type(tl.uint8)) + s_rows * NBYTES
    if has_offset != 0:
        m_at = m_ptr.to(tl.pointer_type(tl.uint8)) + s_rows * NBYTES
    else:
        m_at = s_at
    return s_at, m_at


@triton.jit
def _group_params_at(s_at, m_at, off, scale_f32, has_offset):
    """``_group_params`` from ``_scale_rows``' byte pointers plus byte offsets ``off``; the loads are inline PTX
    (``load_where_used``) so that the values stay in the dot products' layout."""
    if scale_f32 != 0:
        s = load_where_used((s_at + off).to(tl.pointer_type(tl.float32)))
        if has_offset != 0:
            m = load_where_used((m_at + off).to(tl.pointer_type(tl.float32)))
        else:
            m = tl.zeros_like(s)
    else:
        s = load_where_used((s_at + off).to(tl.pointer_type(tl.float16))).to(tl.float32)
        if has_offset != 0:
            m = load_where_used((m_at + off).to(tl.pointer_type(tl.float16))).to(tl.float32)
        else:
            m = tl.zeros_like(s)
    return s, m


@triton.jit
def _w4a16_gemv_kernel(
    x_ptr, w_ptr, sh_ptr, oh_ptr, sf_ptr, of_ptr, b_ptr, y_ptr, part_ptr,
    M, N, K, stride_xm, stride_wn, stride_sn, stride_ym, has_bias, has_offset, scale_f32, group_shift,
    num_splits, reduce_splits,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DECODE: tl.constexpr,
    STAGES: tl.constexpr = 1,
):
    tl.static_assert(BLOCK_M == 1)  # one activation row per program (linear_triton.GEMV_MAX_ROWS says why)
    tl.static_assert(BLOCK_K % 32 == 0)
    SB: tl.constexpr = BLOCK_K // 32  # sub-blocks a step
    # DECODE 3 multiplies in half2 and needs FP16 activations; BF16 / FP32 ones take the FP32 words path (2)
    HALF2: tl.constexpr = (DECODE >= 3) & (x_ptr.dtype.element_ty == tl.float16)
    # DECODE 4: DECODE 3 with the next K step's weight words loaded before the current step's dot products (twice
    # the bytes in flight a program: a step no longer waits a full memory latency)
    PREFETCH: tl.constexpr = HALF2 & (DECODE == 4)
    pid_n = tl.program_id(0)
    row = tl.program_id(1)
    pid_s = tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_ld = rn % N
    mask = rn < N
    if reduce_splits != 0:
        y = _split_k_sum(part_ptr, num_splits, M, N, row, rn_ld, BLOCK_N)
    else:
        sb = tl.arange(0, SB)
        first, last = _split_k_blocks(K, BLOCK_K, num_splits, pid_s)
        # codes minus 8 for the symmetric form (w = (q - 8) * s), as they are for the asymmetric one (w = q s + m)
        zero = tl.where(has_offset != 0, 0.0, 8.0)
        w_rows = rn_ld * stride_wn  # (BN,) byte offset of each weight row
        s_rows = rn_ld[:, None] * stride_sn
        x_row = x_ptr + row * stride_xm
        if HALF2:
            # each row's first scale and offset as byte pointers, once: a step then adds the thread's group
            s_at, m_at, s_bytes = _scale_rows(sh_ptr, oh_ptr, sf_ptr, of_ptr, s_rows, scale_f32, has_offset)
        acc = tl.zeros((BLOCK_N, SB), dtype=tl.float32)  # one FP32 partial per sub-block a thread owns
        if PREFETCH:  # the first step's words; each step then loads the next one's before its own dot products
            words_next = _half2_words(w_ptr, w_rows, first * BLOCK_K, K, BLOCK_N, BLOCK_K)
        for kb in tl.range(first, last, num_stages=STAGES):  # STAGES > 1: the words staged by asynchronous copies
            k0 = kb * BLOCK_K
            sub = k0 + sb * 32  # (SB,) first element of each sub-block
            kmask = sub < K  # K is a multiple of 32: a sub-block is wholly in or out
            if PREFETCH:
                words = words_next
                # the last step re-reads its own tile (in L1/L2) rather than branching
                words_next = _half2_words(w_ptr, w_rows, tl.minimum(kb + 1, last - 1) * BLOCK_K, K, BLOCK_N, BLOCK_K)
                dot, x_sum = _dots_half2_of(words, x_row, k0, K, BLOCK_N, BLOCK_K)
            elif HALF2:
                dot, x_sum = _dots_half2(w_ptr, w_rows, x_row, k0, K, BLOCK_N, BLOCK_K)
            elif DECODE != 0:
                dot, x_sum = _dots_from_words(w_ptr, w_rows, x_row, k0, K, zero, BLOCK_N, BLOCK_K, DECODE >= 2)
            else:
                dot, x_sum = _dots_from_bytes(w_ptr, w_rows, x_row, sub, kmask, k0, zero, SB)
            g = tl.minimum(sub, K - 32) >> 5 >> group_shift  # (SB,) group of each sub-block
            if HALF2:
                s, m = _group_params_at(s_at, m_at, (g * s_bytes)[None, :], scale_f32, has_offset)
                m = m + 8.0 * s  # the half2 dot takes centred codes for both forms: q s + m = (q - 8) s + (m + 8 s)
            else:
                s, m = _group_params(sh_ptr, oh_ptr, sf_ptr, of_ptr, s_rows + g[None, :], scale_f32, has_offset)
            acc += s * dot
            if has_offset != 0:
                acc += m * x_sum[None, :]
        y = tl.sum(acc, axis=1)
        if HALF2:
            y = y * UNSCALE  # the half2 sums took x / 16
    if (reduce_splits == 0) & (num_splits > 1):
        tl.store(part_ptr + (pid_s * M + row) * N + rn, y, mask=mask)  # split-K partials: (splits, M, N) FP32
    else:
        if has_bias != 0:
            y = y + tl.load(b_ptr + rn_ld).to(tl.float32)
        tl.store(y_ptr + row * stride_ym + rn, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _w4a16_gemm_kernel(
    x_ptr, w_ptr, sh_ptr, oh_ptr, sf_ptr, of_ptr, b_ptr, y_ptr,
    M, N, K, stride_xm, stride_wn, stride_sn, stride_ym, has_bias, has_offset, scale_f32, group_shift,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    tl.static_assert(BLOCK_K % 32 == 0)
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n  # grouped launch order: GROUP_M row tiles share each weight column tile in L2
    first_m = (pid // group) * GROUP_M
    group_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % group_m
    pid_n = (pid % group) // group_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm_ld, rn_ld = rm % M, rn % N  # rows/columns past M/N read valid memory; their results are never stored
    kk = tl.arange(0, BLOCK_K)
    # W^T tile (BK, BN): element k sits in byte (k // 32) * 16 + k % 16, its low nibble when k % 32 < 16
    w_cols = w_ptr + rn_ld[None, :] * stride_wn + ((kk // 32) * 16 + kk % 16)[:, None]
    shift = (((kk // 16) % 2) * 4)[:, None]
    x_rows = x_ptr + rm_ld[:, None] * stride_xm + kk[None, :]
    s_cols = rn_ld[None, :] * stride_sn
    zero = tl.where(has_offset != 0, 0.0, 8.0)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = kb * BLOCK_K
        live = (k0 + kk) < K
        a = tl.load(x_rows + k0, mask=live[None, :], other=0.0)  # (BM, BK)
        bq = tl.load(w_cols + k0 // 2, mask=live[:, None], other=0).to(tl.int32)  # (BK, BN)
        g_idx = s_cols + (tl.minimum(k0 + kk, K - 1) >> 5 >> group_shift)[:, None]  # (BK, BN) group of each weight
        s, m = _group_params(sh_ptr, oh_ptr, sf_ptr, of_ptr, g_idx, scale_f32, has_offset)
        w = (((bq >> shift) & 15).to(tl.float32) - zero) * s + m  # the reference's FP32 weights
        acc = tl.dot(a, w.to(a.dtype), acc, input_precision="ieee")
    if has_bias != 0:
        acc = acc + tl.load(b_ptr + rn_ld).to(tl.float32)[None, :]
    y_ptrs = y_ptr + rm[:, None] * stride_ym + rn[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


# --------------------------------------------------------------------------- parameters and spaces
def _params() -> tuple[Param, ...]:
    """The runtime parameters both kernels share, in order (the GEMV inserts its split-K ones)."""
    return (
        Param("x_ptr", "*act", ptr("x")),
        Param("w_ptr", "*u8", ptr("weight")),
        Param("sh_ptr", "*fp16", ptr("scale_h")),
        Param("oh_ptr", "*fp16", ptr("offset_h")),
        Param("sf_ptr", "*fp32", ptr("scale_f")),
        Param("of_ptr", "*fp32", ptr("offset_f")),
        Param("b_ptr", "*act", ptr("bias")),
        Param("y_ptr", "*act", ptr("y")),
        Param("M", "i32", shape("x", 0)),
        Param("N", "i32", shape("weight", 0)),
        Param("K", "i32", shape("x", 1), div16=True),
        Param("stride_xm", "i32", stride("x", 0), div16=True),
        Param("stride_wn", "i32", stride("weight", 0), div16=True),
        Param("stride_sn", "i32", {"attr": "scale_row_stride"}),
        Param("stride_ym", "i32", stride("y", 0), div16=True),
        Param("has_bias", "i32", {"present": "bias"}),
        Param("has_offset", "i32", {"add": [{"present": "offset_h"}, {"present": "offset_f"}]}),
        Param("scale_f32", "i32", {"present": "scale_f"}),
        Param("group_shift", "i32", {"attr": "group_shift"}),
    )


def _gemv_params() -> tuple[Param, ...]:
    p = _params()
    return (*p[:8], Param("part_ptr", "*fp32", ptr("part")), *p[8:],
            Param("num_splits", "i32", sym("NUM_SPLITS")), Param("reduce_splits", "i32", 0))


# The GEMV tile the planner takes: the planner ranks a space by tile size (edgekit/plan/tiles.py), not by speed,
# and the GEMV's few KB of shared memory never bind a budget, so the space is the measured default (the largest
# tile in it) and smaller tiles of the same decode; scripts/bench_w4a16.py times the others. Measured on the H200
# (bench_w4a16.py, 58.7-131 MB of INT4, graph replay): DECODE 2 at 32 x 512, 4 warps: 39.9 / 69.8 / 41.6 us;
# DECODE 1: 59.9 / 113.3 / 60.5 us; DECODE 0 (bytes): 53.6 us; 64 x 512 DECODE 2: 41.0 us; 128 x 256 w8: 46.7 us.
GEMV_DEFAULT = ({"BLOCK_M": 1, "BLOCK_N": 32, "BLOCK_K": 512, "DECODE": 2}, 4, 1)


def _gemv_space(s: dict) -> list:
    # bytes a step = BN * BK / 2: 16-64 a thread (16-byte loads), up to the default's
    c0, w0, _ = GEMV_DEFAULT
    return [
        ({**c0, "BLOCK_N": bn, "BLOCK_K": bk}, w, 1)
        for bn in (8, 16, 32, 64) for bk in (256, 512, 1024) for w in (2, 4, 8)
        if 16 * 32 * w <= bn * bk // 2 <= 64 * 32 * w
        and (bn * bk < c0["BLOCK_N"] * c0["BLOCK_K"] or (bn, bk, w) == (c0["BLOCK_N"], c0["BLOCK_K"], w0))
    ]


def _gemv_default(s: dict):
    return GEMV_DEFAULT


def _gemm_default(s: dict):
    m = int(s.get("rows", s.get("M", 256)))
    if m <= 16:
        return {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}, 4, 3
    if m <= 64:
        return {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}, 4, 3
    # register-bound: the dequantized FP32 tile lives beside the accumulator (128 x 128 at 4 warps spills)
    return {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}, 8, 3


def _gemm_smem(c, warps, stages, nbytes):
    # pipelined x tiles and packed weight tiles (half a byte a weight), or the epilogue's layout conversion
    pipe = max(1, stages - 1) * (c["BLOCK_M"] * c["BLOCK_K"] * nbytes + c["BLOCK_K"] * c["BLOCK_N"] // 2)
    dot_operands = c["BLOCK_M"] * 32 * nbytes + 32 * c["BLOCK_N"] * nbytes
    return max(pipe + dot_operands, c["BLOCK_M"] * c["BLOCK_N"] * 4 // max(1, warps // 4))


_PRECISION = {"input": "{act} activations, packed int4 weights + fp16/fp32 group scales (+ offsets)",
              "accumulate": "fp32", "output": "{act}"}

W4A16_GEMV = KernelDef(
    op="linear_w4a16", kernel="w4a16_gemv", fn=_w4a16_gemv_kernel, params=_gemv_params(),
    constexpr_names=("BLOCK_M", "BLOCK_N", "BLOCK_K", "DECODE"), precision=_PRECISION,
    # only the final cross-thread reduction of the partials goes through shared memory
    uses_shared_memory=True, space=_gemv_space, default=_gemv_default,
    # the partials' reduction, and with STAGES > 1 the packed weight tiles in flight (half a byte a weight)
    smem_estimate=lambda c, warps, stages, nbytes: (max(4096, 4 * c["BLOCK_N"] * c["BLOCK_K"] // 32)
                                                    + (stages - 1) * c["BLOCK_N"] * c["BLOCK_K"] // 2),
    loop_stages=True,
)
W4A16_GEMM = KernelDef(
    op="linear_w4a16", kernel="w4a16_gemm", fn=_w4a16_gemm_kernel, params=_params(),
    constexpr_names=("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"), precision=_PRECISION,
    # tiles up to 128 x 64 (larger ones keep two FP32 tiles live and spill), K tiles up to 4 sub-blocks
    uses_shared_memory=True,
    space=lambda s: [c for c in _gemm_space(s) if c[0]["BLOCK_K"] <= 128 and c[0]["BLOCK_M"] * c[0]["BLOCK_N"] <= 8192],
    default=_gemm_default, smem_estimate=_gemm_smem,
)


# --------------------------------------------------------------------------- program
def w4a16_program(variants) -> dict:
    M, N, K = shape("x", 0), shape("weight", 0), shape("x", 1)
    v_gemv = variants.get(W4A16_GEMV.kernel)
    splits = _gemv_splits(v_gemv.constexprs, W4A16_GEMM.kernel in variants) if v_gemv is not None else 1
    used = {"min": [1, {"sub": [sym("NUM_SPLITS"), 1]}]}  # 0 without split-K: an empty partials buffer
    return program_doc(
        "linear_w4a16", ["x", "weight", "scale_h", "offset_h", "scale_f", "offset_f", "bias"],
        ["scale_h", "offset_h", "scale_f", "offset_f", "bias"], ["scale_row_stride", "group_shift"],
        checks=[
            check("eq", mul(shape("weight", 1), 2), K, "packed weight (N, K/2) must match x (M, K)"),
            check("multiple_of", K, SUBBLOCK, f"K must be a multiple of the {SUBBLOCK}-element sub-block"),
            check("eq", {"add": [{"present": "scale_h"}, {"present": "scale_f"}]}, 1,
                  "exactly one of scale_h (fp16) and scale_f (fp32) is given"),
        ],
        let=[["NUM_SPLITS", splits]],
        buffers=[{"name": "y", "shape": [M, N], "dtype": {"like": "x"}},
                 {"name": "part", "shape": [mul(sym("NUM_SPLITS"), used), M, N], "dtype": "fp32"}],
        launches=_mm_launches(variants, W4A16_GEMV, W4A16_GEMM),
        outputs=["y"],
    )


# --------------------------------------------------------------------------- host-side checks


W4A16_OP = OpKernels("linear_w4a16", (W4A16_GEMV, W4A16_GEMM), w4a16_program, prepare_w4a16,
                     required=(("w4a16_gemv", "w4a16_gemm"),))
