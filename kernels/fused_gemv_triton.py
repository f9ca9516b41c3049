"""Building blocks of the fused decode super-operators (Triton device functions, no kernels of their own).

A fused decode operator reads one activation row, optionally RMS-normalises
it, and multiplies it by a block of weight rows (a GEMV), then does its own
epilogue (RoPE + KV-cache write, residual add, SwiGLU, argmax). The pieces
shared by all of them live here:

- ``_row_rstd``: 1 / sqrt(mean(x^2) + eps) of one row in FP32 (IEEE division
  and square root, as ``rmsnorm_fwd``). Every program recomputes it: the row is
  at most a few KB and sits in L1/L2, which is cheaper than a launch boundary.
- ``_gemv_rows``: (normalised) x @ W[rows].T in FP32 for an arbitrary vector of
  weight rows (the callers interleave gate/up or RoPE half-pairs so that one
  pass over K serves both halves of their epilogue). Accumulation follows
  ``linear_triton._gemv_kernel``: per-thread FP32 partials, one per 16-weight
  run, reduced once after the K loop, INT8 converted with the same inline PTX.
  One K step is ``_load_weight_tile`` then ``_gemv_fma`` (kernels whose
  activation is not a plain row, e.g. the split-KV combine of
  fused_attn_proj_residual, run their own loop around them); the weight decode
  is ``_weight_tile_f32``.
  The normalised activation is rounded to the activation dtype before the
  product, as the per-operator path (rmsnorm writes its output in that dtype),
  so both paths compute the same products.

Weight formats (the ``W_FORMAT`` constexpr of every fused GEMV kernel, fixed by the kernel's identity):
``FLOAT`` (weights in the activation dtype), ``INT8`` (W8A16: per-channel FP32 scale applied in ``_epilogue``) and
``INT4`` (W4A16, kernels/int4_layout.py: packed uint8 (N, K/2) in GGML nibble order, group scales (N, K/G) in FP16
or FP32, optional offsets). An INT4 K step loads the rows' BLOCK_K / 8 int32 words and decodes them with the W4A16
GEMV's decoders, chosen at compile time by the activation dtype (``_int4_fma``):

- FP16 activations: the half2 decode (DECODE 3, kernels/int4_half2_triton.py: nibbles to FP16 with the 0x6400
  magic number and LOP3 in inline PTX, HFMA2 products summed in FP16 within a 32-element sub-block, x pre-scaled
  by 1/16 for range). The activation step, computed in registers (RMS-normalised, or combined from split-KV
  partials), becomes the decode's activation pairs and their sum once per K step (``activation_pairs_of``: one
  trip through shared memory a step), shared by every row a thread holds; the group scales are loaded as DECODE 3
  loads them (``_int4_group_params``: inline PTX loads, in the dot products' layout).
  Measured and not kept (H100, 2026-12-06, llama-3.2-1b int4-head step, tools/gpu_session.sh stepab): loading each
  sub-block's 16 activation words in the threads that hold its weights, as the W4A16 GEMV does, takes the shared
  memory and its 8 barriers out of the down projection's K loop (67 -> 56 registers), but the words are 4-byte
  loads 64 B apart: through L2 (.cg, as activations are read here) the step fell from 1728.6 to 904.4 tok/s, with
  L1-cached loads (which the coherence rule below forbids) to 1633.9. Also normalising those words in place for the
  RMSNorm kernels: 691.6 tok/s.
- BF16 / FP32 activations: the FP32 word decode (DECODE 2, ``linear_w4a16_triton._word_dots``: nibbles to FP32
  with one shift and one LOP3, exact products), the activation taken apart into its per-byte vectors once per
  step (``_int4_activation_runs``).

Either gives one FP32 partial per row and 32-element sub-block, to which the group scale (and offset * sum x) is
applied, FP32 accumulation as the other formats. The group of a sub-block is looked up per sub-block (as the
W4A16 GEMV does), so any BLOCK_K that is a multiple of 32 serves G = 32, 64 and 128 alike; scale dtype and the
symmetric / offset form are uniform runtime flags, so one compiled variant serves every INT4 bundle and GGUF file.

Static SASS count of the INT4 kernels' K loop, instructions a weight (tools/fused_sass_report.py at
llama-3.2-1b shapes, default tiles, both sides of the scale-dtype branch counted; static count, not measured on a
GPU), sm_90 / sm_87, FP32 word decode at the previous INT4 tiles -> half2 decode at ``int4_gemv_tile``'s:

    norm_qkv_rope_w4       5.30 / 5.25 -> 3.37 / 3.46   (16 rows x 2048, 4 warps, 96 registers)
    norm_swiglu_w4         5.29 / 5.30 -> 3.05 / 3.07   (gate/up: 32 rows x 1024, 4 warps, 160 / 168 registers)
    proj_residual_w4       5.89 / 5.80 -> 3.03 / 3.04   (down: 8 rows x 4096, 4 warps, 102 / 96 registers)
    attn_proj_residual_w4  10.16 / 9.98 -> 8.31 / 8.34  (counted when the o-projection redid the split-KV combine;
                                                         it is now proj_residual's kernel on the merged output)

no spills, 0.5-8 KB of shared memory; the INT8 kernels at the same shapes counted 4.3-5.7 (8.4 for the o-proj) on
this change's base. (Static counts at the tiles of that time; the tiles have since moved to fewer weights a
thread where the GPU measured them faster: ``int4_gemv_tile``.) An INT4 weight is half a byte: at the H200's issue
rate a kernel streams INT4 weights at full bandwidth only at ~3.5 thread-instructions a weight or fewer.

The INT4 operands ride at the end of the program functions with defaults (0), so callers that only run float and
INT8 weights call them unchanged.

Activations are read with ``cache_modifier=".cg"`` (through L2, not L1): they were written by the previous
kernel of the step, possibly after this SM cached the old row in L1. Weights, written once at load time, are
read normally.
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgekit.kernels.int4_half2_triton import UNSCALE, _split4, activation_pairs_of, subblock_dots_half2
from edgekit.kernels.linear_triton import _int8_to_f32
from edgekit.kernels.linear_w4a16_triton import _group_params, _group_params_at, _scale_rows, _word_dots
from edgekit.kernels.pdl_triton import _pdl_enter_after_weights
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.fused_decode_common import weight_operands  # noqa: F401 (re-exported)

# W_FORMAT values: how a fused GEMV kernel reads its weight tile
FLOAT, INT8, INT4 = 0, 1, 2


@triton.jit
def _row_rstd(x_row, K, eps, BLOCK_K: tl.constexpr):
    rk = tl.arange(0, BLOCK_K)
    ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_row + k0 + rk, mask=(k0 + rk) < K, other=0.0, cache_modifier=".cg").to(tl.float32)
        ss += x * x
    return _rstd(tl.sum(ss, axis=0), K, eps)


@triton.jit
def _rstd(sum_sq, n, eps):
    """1 / sqrt(sum_sq / n + eps) with IEEE-rounded division and square root (not the approximate ones), as the
    RMSNorm kernels compute it: the fused norms match the per-operator path's rstd."""
    return tl.math.div_rn(1.0, tl.math.sqrt_rn(tl.math.div_rn(sum_sq, n * 1.0) + eps))


@triton.jit
def _weight_tile_f32(w, W_FORMAT: tl.constexpr):
    """A loaded float or INT8 weight tile in FP32: the weight decode (INT4 tiles take ``_int4_fma``'s word decode)."""
    if W_FORMAT == 1:  # INT8
        return _int8_to_f32(w)
    return w.to(tl.float32)


@triton.jit
def _load_weight_tile(w_rows, k0, K, W_FORMAT: tl.constexpr, BLOCK_K: tl.constexpr):
    """W[rows, k0:k0 + BLOCK_K] as stored (issued before the activation's loads: more bytes in flight).

    Float / INT8: (BLOCK_R, BLOCK_K) elements. INT4: (BLOCK_R, BLOCK_K / 8) int32 words of the packed rows (word i
    of a 32-element sub-block holds its bytes 4i..4i+3); ``w_rows`` are byte pointers, row strides in bytes."""
    if W_FORMAT == 2:  # INT4
        wi = tl.arange(0, BLOCK_K // 8)
        live = k0 + (wi // 4) * 32 < K  # K is a multiple of 32: a sub-block is wholly in or out
        words = w_rows.to(tl.pointer_type(tl.int32)) + (k0 // 8 + wi)[None, :]
        return tl.load(words, mask=live[None, :], other=0)  # (BLOCK_R, BLOCK_K / 8)
    else:
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        return tl.load(w_rows + k[None, :], mask=kmask[None, :], other=0)  # (BLOCK_R, BLOCK_K)


@triton.jit
def _gemv_acc(BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, W_FORMAT: tl.constexpr):
    """The FP32 partials of a fused GEMV: one per row and 16-weight run (INT4: per 32-weight sub-block)."""
    if W_FORMAT == 2:  # INT4
        return tl.zeros((BLOCK_R, BLOCK_K // 32), dtype=tl.float32)
    else:
        return tl.zeros((BLOCK_R, BLOCK_K // 16), dtype=tl.float32)


@triton.jit
def _gemv_fma(acc, w, x, W_FORMAT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
              rows=0, k0=0, K=0, sf_ptr=0, sh_ptr=0, oh_ptr=0, of_ptr=0, stride_sn=0, has_offset=0, scale_f32=0,
              group_shift=0):
    """acc += W[rows, k] * x[k] in FP32 for one K step; x (BLOCK_K,) in the act dtype, w from ``_load_weight_tile``.

    INT4 takes the tile's rows, K step and group operands (``int4_params``) as well; float and INT8 ignore them."""
    if W_FORMAT == 2:  # INT4
        s, m = _int4_group_params(rows, k0, K, sf_ptr, sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32,
                                  group_shift, x.dtype == tl.float16, BLOCK_K)  # (BLOCK_R, SB) FP32
        return _int4_fma(acc, w, x, s, m, has_offset, BLOCK_R, BLOCK_K)
    else:
        prod = _weight_tile_f32(w, W_FORMAT) * x.to(tl.float32)[None, :]
        return acc + tl.sum(tl.reshape(prod, (BLOCK_R, BLOCK_K // 16, 16)), axis=2)


@triton.jit
def _group_index(rows, k0, K, stride_sn, group_shift, BLOCK_K: tl.constexpr):
    """(BLOCK_R, SB) index of each row's group scale for the K step's sub-blocks (those past K: the last one's)."""
    sub = k0 + tl.arange(0, BLOCK_K // 32) * 32
    g = tl.minimum(sub, K - 32) >> 5 >> group_shift
    return rows.to(tl.int64)[:, None] * stride_sn + g[None, :]


@triton.jit
def _int4_group_params(rows, k0, K, sf_ptr, sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift,
                       HALF2: tl.constexpr, BLOCK_K: tl.constexpr):
    """Group scales and offsets (BLOCK_R, SB) FP32 of the K step's sub-blocks. The half2 path loads them as DECODE 3
    does (``_group_params_at``: inline PTX loads, which take the dot products' layout instead of moving through
    shared memory every step)."""
    if HALF2:
        s_at, m_at, s_bytes = _scale_rows(sh_ptr, oh_ptr, sf_ptr, of_ptr, rows.to(tl.int64)[:, None] * stride_sn,
                                          scale_f32, has_offset)
        sub = k0 + tl.arange(0, BLOCK_K // 32) * 32
        g = tl.minimum(sub, K - 32) >> 5 >> group_shift  # (SB,) group of each sub-block (past K: the last one's)
        return _group_params_at(s_at, m_at, (g * s_bytes)[None, :], scale_f32, has_offset)
    else:
        return _group_params(sh_ptr, oh_ptr, sf_ptr, of_ptr, _group_index(rows, k0, K, stride_sn, group_shift, BLOCK_K),
                             scale_f32, has_offset)


@triton.jit
def _int4_activation_runs(x, BLOCK_K: tl.constexpr):
    """The activation step x (BLOCK_K,) as the word decode multiplies it: per byte b of each word, FP32 (W,)
    vectors of the elements its low nibbles (x[32 s + 4i + b]) and high nibbles (x[32 s + 16 + 4i + b]) stand for,
    and their sums per word. Once per K step, shared by every row of the tile."""
    W: tl.constexpr = BLOCK_K // 8
    xr = tl.permute(tl.reshape(x.to(tl.float32), (BLOCK_K // 32, 2, 4, 4)), (0, 2, 3, 1))  # [sub-block, i, b, half]
    x_lo, x_hi = tl.split(xr)  # (SB, 4, 4) [sub-block, word i, byte b]
    lo0, lo1, lo2, lo3 = _split4(tl.reshape(x_lo, (W, 4)))
    hi0, hi1, hi2, hi3 = _split4(tl.reshape(x_hi, (W, 4)))
    return lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3, (lo0 + lo1) + (lo2 + lo3), (hi0 + hi1) + (hi2 + hi3)


@triton.jit
def _int4_fma(acc, words, x, s, m, has_offset, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc (BLOCK_R, SB) += s * sum (q - zero) x + m * sum x per sub-block, group scale ``s`` and offset ``m``
    (BLOCK_R, SB) applied per sub-block. FP16 activations: the W4A16 GEMV's half2 decode (DECODE 3,
    kernels/int4_half2_triton.py) on the packed words, the activation pairs made once per K step from x in
    registers; BF16 / FP32 ones: its FP32 word decode (``_word_dots``)."""
    HALF2: tl.constexpr = x.dtype == tl.float16
    if HALF2:
        pairs, x_sum = activation_pairs_of(x, BLOCK_K)  # (SB,) x 16, (SB,): sums of x / 16
        dot = subblock_dots_half2(tl.reshape(words, (BLOCK_R, BLOCK_K // 32, 4)), pairs)  # sum (q - 8) x / 16
        acc += (s * UNSCALE) * dot  # x 16 is exact: the sums took x / 16
        if has_offset != 0:  # centred codes for both forms: q s + m = (q - 8) s + (m + 8 s)
            acc += ((m + 8.0 * s) * UNSCALE) * x_sum[None, :]
    else:
        zero = tl.where(has_offset != 0, 0.0, 8.0)  # symmetric: w = (q - 8) s; with offsets: w = q s + m
        lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3, xs_lo, xs_hi = _int4_activation_runs(x, BLOCK_K)
        dot, x_sum = _word_dots(words, lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3, xs_lo, xs_hi, zero, BLOCK_R,
                                BLOCK_K // 32)
        acc += s * dot
        if has_offset != 0:
            acc += m * x_sum[None, :]
    return acc


@triton.jit
def _gemv_rows(x_row, nw_ptr, eps, w_ptr, rows, K, stride_wn,
               NORM: tl.constexpr, W_FORMAT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
               sf_ptr=0, sh_ptr=0, oh_ptr=0, of_ptr=0, stride_sn=0, has_offset=0, scale_f32=0, group_shift=0,
               NORM_BLOCK_K: tl.constexpr = 0, STAGES: tl.constexpr = 1, NORM_FACTORED: tl.constexpr = 0):
    """sum_k W[rows, k] * h[k] in FP32, h = x (NORM false) or act(x * rstd * nw) (NORM true, rstd = ``_row_rstd``
    of the row with ``eps``, summed in NORM_BLOCK_K steps, 0: BLOCK_K). rows: (BLOCK_R,). Float weights with NORM
    and NORM_FACTORED: ``_norm_gemv_rows_float`` (rstd applied after the sum, h not rounded; the QKV kernels).

    Each step loads its weight tile, then its activation. STAGES > 1 (the variant's num_stages): the loop carries it,
    so Triton stages the next STAGES - 1 steps' loads through shared memory by asynchronous copies (cp.async) while
    this step computes: bytes in flight without holding them in registers.

    Measured on the H200 (2026-12-02, llama-3.2-1b, fused decode, tok/s fp16 / int8 / int4 against 1127 / 1446 /
    1474 in the same call) and not kept: the first tile requested before the norm's reduction (peeled from the
    loop) 1061 / 1437 / 1509, and every next step's tile and activation requested one step ahead in registers
    (loop-carried) 1047 / 1161 / 1501 (in another call, against 1131 / 1443 / 1476). Both hold a weight tile in
    registers across code that did not hold one before; the staged loop keeps it in shared memory instead.

    INT4 weights: ``stride_wn`` in bytes, group operands as ``_gemv_fma`` takes them; the group scales are applied
    here, so the result needs no per-channel scale (``_epilogue``)."""
    rk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    acc = _gemv_acc(BLOCK_R, BLOCK_K, W_FORMAT)
    if NORM and NORM_FACTORED and W_FORMAT == 0:  # float weights: the norm's scale comes out of the sum (below)
        return _norm_gemv_rows_float(x_row, nw_ptr, eps, w_rows, K, acc, BLOCK_R, BLOCK_K, STAGES)
    if NORM:
        rstd = _row_rstd(x_row, K, eps, BLOCK_K if NORM_BLOCK_K == 0 else NORM_BLOCK_K)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        k = k0 + rk
        kmask = k < K
        w = _load_weight_tile(w_rows, k0, K, W_FORMAT, BLOCK_K)
        x = tl.load(x_row + k, mask=kmask, other=0.0, cache_modifier=".cg")  # (BLOCK_K,)
        if NORM:
            nw = tl.load(nw_ptr + k, mask=kmask, other=0.0).to(tl.float32)
            x = (x.to(tl.float32) * rstd * nw).to(x_row.dtype.element_ty)
        acc = _gemv_fma(acc, w, x, W_FORMAT, BLOCK_R, BLOCK_K, rows, k0, K, sf_ptr, sh_ptr, oh_ptr, of_ptr, stride_sn,
                        has_offset, scale_f32, group_shift)
    return tl.sum(acc, axis=1)


@triton.jit
def _norm_gemv_rows_float(x_row, nw_ptr, eps, w_rows, K, acc, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                          STAGES: tl.constexpr):
    """``_gemv_rows`` with NORM for float weights: rstd * sum_k W[rows, k] * (x[k] * nw[k]), all in FP32, the sum of
    squares gathered in the same loop.

    Why not the norm first (``_row_rstd``, as INT8 and INT4 weights still do): its reduction over x (a load, a
    cross-warp sum through shared memory, a barrier) comes before the first weight load, so every program of the
    kernel waits one activation round trip and a barrier before its weight stream starts: on the H200 the fused
    norm -> GEMV kernels paid ~1.5 us a launch more than the plain GEMVs beside them (qwen3-1.7b, fp16, CUDA-graph
    replay: norm + gate/up 50 MB 15.6 us against down 25 MB 8.3 us and the o-projection 8 MB 4.6 us). Here the
    weights stream from the first instruction.

    Where (H200, 2026-12-05, fp16, CUDA-graph replay at the default tiles, mean of two interleaved rounds, main's
    kernels against this in every fused norm -> GEMV kernel): the QKV kernels gained at every shape (qwen3-1.7b
    qk-norm 9.83 -> 9.68 us with that kernel's tail change, gemma-3-1b 7.87 -> 6.08, qwen3-0.6b 9.72 -> 6.67,
    llama-3.2-1b plain QKV 7.21 -> 6.54), the gate/up kernels lost at three shapes of four (qwen3-1.7b 15.76 ->
    16.89, llama-3.2-1b 19.55 -> 21.07, gemma-3-1b GeGLU 13.95 -> 15.59; qwen3-0.6b 7.06 -> 5.97): only the QKV
    kernels take it (NORM_FACTORED), where a program's few rows make the norm's wait a large part of its time.
    Why the gate/up kernels lose is not known (not profiled: the FP32 product over the whole tile is a guess).

    Numerics: the activation is not rounded to FP16 between the norm and the GEMV (the per-operator path rounds it
    there), so the result is nearer the FP64 reference, not bit-identical to the per-operator path. INT8 / INT4
    keep the rounded activation: their dot products take it in the activation dtype (the INT4 half2 path's range),
    and x * nw unnormalised need not fit there."""
    rk = tl.arange(0, BLOCK_K)
    ss = tl.zeros((BLOCK_K // 16,), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        k = k0 + rk
        kmask = k < K
        w = _load_weight_tile(w_rows, k0, K, 0, BLOCK_K)
        x = tl.load(x_row + k, mask=kmask, other=0.0, cache_modifier=".cg").to(tl.float32)  # (BLOCK_K,)
        nw = tl.load(nw_ptr + k, mask=kmask, other=0.0).to(tl.float32)
        ss += tl.sum(tl.reshape(x * x, (BLOCK_K // 16, 16)), axis=1)
        prod = w.to(tl.float32) * (x * nw)[None, :]
        acc = acc + tl.sum(tl.reshape(prod, (BLOCK_R, BLOCK_K // 16, 16)), axis=2)
    return tl.sum(acc, axis=1) * _rstd(tl.sum(ss, axis=0), K, eps)


@triton.jit
def _epilogue_operands(s_ptr, b_ptr, rows, has_bias, W_FORMAT: tl.constexpr):
    """(INT8 channel scale, bias) of ``rows`` in FP32 (1 and 0 where absent). Loaded before the GEMV, their latency
    hides behind the weight stream instead of following its last step."""
    scale = tl.full(rows.shape, 1.0, tl.float32)
    if W_FORMAT == 1:  # INT8
        scale = tl.load(s_ptr + rows)
    bias = tl.zeros(rows.shape, tl.float32)
    if has_bias != 0:
        bias = tl.load(b_ptr + rows).to(tl.float32)
    return scale, bias


@triton.jit
def _epilogue_apply(acc, scale, bias, has_bias, W_FORMAT: tl.constexpr, DTYPE: tl.constexpr):
    """Per-channel INT8 scale, bias, then rounding to the activation dtype (as linear's output), back in FP32."""
    if W_FORMAT == 1:  # INT8
        acc = acc * scale
    if has_bias != 0:  # not + 0.0 without a bias: -0.0 stays -0.0, as linear's output
        acc = acc + bias
    return acc.to(DTYPE).to(tl.float32)


@triton.jit
def _epilogue(acc, s_ptr, b_ptr, rows, has_bias, W_FORMAT: tl.constexpr, DTYPE: tl.constexpr):
    """``_epilogue_apply`` with its operands loaded now (callers with nothing to overlap them with)."""
    scale, bias = _epilogue_operands(s_ptr, b_ptr, rows, has_bias, W_FORMAT)
    return _epilogue_apply(acc, scale, bias, has_bias, W_FORMAT, DTYPE)


@triton.jit
def _pdl_enter_gemv(w_ptr, rows, K, stride_wn, BLOCK_K: tl.constexpr, W_FORMAT: tl.constexpr, PDL: tl.constexpr):
    """``_pdl_enter_after_weights`` for a fused GEMV kernel: the first K tile of its weight rows, in stored bytes."""
    if W_FORMAT == 2:  # INT4
        _pdl_enter_after_weights(w_ptr, rows, K // 2, stride_wn, BLOCK_K // 2, PDL)  # packed: K / 2 bytes a row
    else:
        _pdl_enter_after_weights(w_ptr, rows, K, stride_wn, BLOCK_K, PDL)


# --------------------------------------------------------------------------- host side: tiles
# An unstaged GEMV step (STAGES 1) loads one (rows, BLOCK_K) weight tile and waits for it before the FMAs, so each
# K step costs a memory latency (~0.5-1 us from HBM). (STAGES > 1 keeps later steps' tiles in flight through shared
# memory; the operators' default tiles take it where the tile sweep measured a gain: see their _default functions.)
# Measured on the H200 with 16 x 128 tiles (2048 weights a step): the 1B QKV GEMV (C = 2048, 16 steps) took 13.5 us
# for 12.6 MB, 4x its bandwidth time. Hence: K in as few steps as registers allow (BLOCK_K up to 2048), ~8-16K
# weights a step (the per-operator GEMV's 32 x 256 is 8K), and rows per program chosen so the grid still covers the
# SMs.
MAX_BLOCK_K = 2048
STEP_WEIGHTS = 8192
TARGET_PROGRAMS = 132  # one H200 wave (Orin: 16 SMs, more than covered)


def gemv_tile(s: dict, *, min_rows: int = 4, max_rows: int = 32, int4: bool = False) -> tuple[int, int, int]:
    """(weight rows per program, BLOCK_K, num_warps) for a fused GEMV over an n_out x k_in weight (shape facts).

    Without facts (tile_space / AOT without a model) a 1B-class shape is assumed. ``int4``: the INT4 kernels' tile
    (``int4_gemv_tile``).
    """
    from edgekit.kernels.kernel_def import pow2_at_least

    if int4:
        return int4_gemv_tile(s, min_rows=min_rows)
    k = int(s.get("k_in") or 2048)
    n = int(s.get("n_out") or 8192)
    block_k = min(pow2_at_least(k, 64), MAX_BLOCK_K)
    rows = max(min_rows, min(max_rows, STEP_WEIGHTS // block_k))
    while rows > min_rows and n // rows < TARGET_PROGRAMS:
        rows //= 2  # fewer rows a program until the grid covers the SMs
    warps = max(4, min(16, rows * block_k // 2048))  # ~64 weights a thread a step: no spills
    return rows, block_k, warps


def measured_from_k(k_min: int, measured: tuple[dict, int, int], otherwise, k_unknown: int = 2048):
    """A default-tile function: the tile a GPU sweep measured best, ``measured`` (constexprs, warps, stages), for
    reductions of at least ``k_min``; ``otherwise(shape facts)`` below. Facts without a K count as ``k_unknown``."""
    def default(s: dict):
        if int(s.get("k_in") or k_unknown) >= k_min:
            return dict(measured[0]), measured[1], measured[2]
        return otherwise(s)

    return default


# INT4 tiles, chosen for the half2 decode (FP16 activations; BF16 / FP32 ones run the FP32 word decode at the same
# tile, without spills) by the static SASS count of the K loop and the registers on sm_90 and sm_87 (scripts/
# fused_sass_report.py; static counts, not measured on a GPU). What sets the count is the weights a thread holds a
# step: the half2 dot is ~1.7 instructions a weight, but each thread also makes its sub-block's activation pairs
# and sum (~75 instructions) and its share of the step's RMSNorm, which only its rows amortise. At llama-3.2-1b
# gate/up (both branches of the scale dtype counted, sm_90): 4.2 instructions a weight at 64 weights a thread, 3.6
# at 128, 3.05 at 256 (8 rows x one sub-block, 160-168 registers), 2.9 at 512 (255 registers: one program a
# SM). Hence 256 weights a thread (Triton lays the packed tile's 32 lanes, then its warps, along K first), 16 KB of
# packed weights a program and step, and more rows over a shorter step while the grid still covers the SMs: a
# thread's RMSNorm and pair work is BLOCK_K / threads elements, shared by its rows (gate/up: 3.05 at 32 rows x 1024
# against 3.32 at 16 x 2048).
#
# Then measured (H200, 2026-12-02, tools/fused_tile_sweep.py --precisions int4, llama-3.2-1b, 26-36 candidates an
# operator): the smaller GEMVs are faster with fewer weights a thread and more programs than the instruction count
# alone favours, because Nsight Compute found these kernels latency-bound (16-25% occupancy at 126-168 registers),
# not issue-bound. Best against the rule above: qkv 8 x 2048 at 4 warps 5.15 us (16 x 2048: 5.65), o 4 x 2048 at 2
# warps 3.94 (8 x 2048: 4.17), down 4 x 4096 at 4 warps 6.23 (8 x 4096: 6.95); gate/up stayed best near 32 x 1024 at
# 4 warps (11.5 us; 8 warps 11.6). Hence ~128 weights a thread, at most 4 warps, and at least two programs an SM.
# llama-3.2-1b: qkv 8 x 2048, o 4 x 2048 (2 warps), gate/up 32 x 1024, down 4 x 4096.
INT4_STEP_WEIGHTS = 32768
INT4_MAX_BLOCK_K = 4096
INT4_MAX_ROWS = 32
INT4_THREAD_WEIGHTS = 128
INT4_MAX_WARPS = 4
INT4_TARGET_PROGRAMS = 2 * TARGET_PROGRAMS


def int4_gemv_tile(s: dict, *, min_rows: int = 4) -> tuple[int, int, int]:
    """``gemv_tile`` of the INT4 kernels (the rule above): (weight rows per program, BLOCK_K, num_warps)."""
    from edgekit.kernels.kernel_def import pow2_at_least

    k = int(s.get("k_in") or 2048)
    n = int(s.get("n_out") or 8192)
    block_k = min(pow2_at_least(k, 64), INT4_MAX_BLOCK_K)
    rows = max(min_rows, min(INT4_MAX_ROWS, INT4_STEP_WEIGHTS // block_k))
    while rows < INT4_MAX_ROWS and block_k > 1024 and n // (2 * rows) >= TARGET_PROGRAMS:
        rows, block_k = 2 * rows, block_k // 2  # more rows, shorter step: less activation work a weight
    while rows > min_rows and n // rows < INT4_TARGET_PROGRAMS:
        rows //= 2  # fewer rows a program until the grid covers the SMs twice
    warps = max(2, min(INT4_MAX_WARPS, rows * block_k // (32 * INT4_THREAD_WEIGHTS)))
    return rows, block_k, warps


# --------------------------------------------------------------------------- host side: kernel definitions
# kernel name suffix, weight pointer type, the fp32 scale slot's value (the INT8 channel scale, or the INT4 group
# scale when it is FP32), and the precision the plan and manifest record, per W_FORMAT
_FORMATS = {
    FLOAT: ("fp", "*act", None, "{act}"),
    INT8: ("w8", "*i8", "scale", "{act} x int8 weights (+ fp32 channel scales)"),
    INT4: ("w4", "*u8", "scale_f", "{act} x packed int4 weights (+ fp16/fp32 group scales, optional offsets)"),
}
FORMAT_NAMES = {FLOAT: "float", INT8: "INT8 (W8A16)", INT4: "INT4 (W4A16)"}
# The optional inputs and attributes that carry INT4 weights' group scales and offsets (int4_weight_slots)
INT4_INPUTS = ["scale_h", "scale_f", "offset_h", "offset_f"]
INT4_ATTRS = ["scale_row_stride", "group_shift"]


def weight_kernels(op: str, name: str, fn, params, constexpr_names: tuple[str, ...], space, default,
                   default_w8=None, default_w4=None, formats: tuple[int, ...] = (FLOAT, INT8, INT4),
                   rows_a_step=lambda c: c["BLOCK_N"]):
    """The float, INT8 (W8A16) and INT4 (W4A16) KernelDefs of one fused kernel (one Triton function).

    ``params(w_type, scale_value)`` lists the kernel's parameters; the INT8 kernel's scale pointer is ``scale``, the
    INT4 kernel's is ``scale_f`` (its FP32 group scales; FP16 ones come through ``int4_params``), the float kernel
    gets a null pointer. ``W_FORMAT`` is fixed by the kernel's identity. ``default_w8`` / ``default_w4``: a format's
    own default tile where it differs (else ``default``); INT4 tiles need BLOCK_K a multiple of 32. ``formats``: the
    weight formats the kernel takes (a kernel without ``int4_params`` leaves INT4 out). ``rows_a_step(constexprs)``:
    the weight rows a program multiplies a K step (the shared-memory estimate of a staged K loop).
    """
    from edgekit.kernels.kernel_def import KernelDef
    from edgekit.kernels.launch_rule import ptr

    def make(fmt: int):
        suffix, w_type, scale_slot, precision = _FORMATS[fmt]
        dflt = {INT8: default_w8, INT4: default_w4}.get(fmt) or default
        return KernelDef(
            op=op, kernel=f"{name}_{suffix}", fn=fn, params=params(w_type, ptr(scale_slot) if scale_slot else 0),
            constexpr_names=constexpr_names + ("W_FORMAT",),
            precision={"input": precision, "accumulate": "fp32", "output": "{act}"},
            # no tiles the planner must fit to a budget: cross-warp reductions use a few hundred bytes, and a staged K
            # loop (STAGES > 1) a few tens of KB at the tiles it is chosen for (the compiled size is checked)
            uses_shared_memory=False,
            space=_format_space(space, dflt, fmt), default=dflt,
            smem_estimate=_staged_smem(fmt, rows_a_step),
            fixed={"W_FORMAT": fmt},
            pdl=True,  # every fused GEMV kernel takes the PDL switch (kernels/pdl_triton.py)
            loop_stages=True,  # and its K loop's pipeline depth (num_stages)
        )

    return tuple(make(fmt) for fmt in formats)


def _staged_smem(fmt: int, rows_a_step):
    """Shared-memory estimate of a fused GEMV kernel: its reductions, and with STAGES > 1 the STAGES - 1 weight tiles
    and activation (and norm weight) steps in flight (INT8: a byte a weight, INT4: half a byte; INT4 group scales are
    not counted, a few percent)."""
    def estimate(c, warps: int, stages: int, nbytes: int) -> int:
        weight_bytes = {FLOAT: nbytes, INT8: 1, INT4: 0.5}[fmt]
        step = rows_a_step(c) * c["BLOCK_K"] * weight_bytes + 2 * c["BLOCK_K"] * nbytes
        return int(8 * 32 * warps + (stages - 1) * step)

    return estimate


def _int4_tile_ok(constexprs: dict) -> bool:
    return constexprs.get("BLOCK_K", 32) % 32 == 0  # whole 32-element sub-blocks a K step


def _format_space(space, default, fmt: int):
    """A format kernel's tile space: the operator's tiles (INT4: those of whole sub-blocks a step) and the format's
    own default tile (``int4_gemv_tile``'s, or a staged one, may lie outside the operator's space)."""
    def format_space(s: dict) -> list:
        tiles = [c for c in space(s) if fmt != INT4 or _int4_tile_ok(c[0])]
        own = default(s)
        return tiles if own in tiles else tiles + [own]

    return format_space


def operand_params(w_type: str, scale_value, *, norm: bool, bias: bool) -> tuple:
    """The leading parameters of every fused GEMV kernel: x, [norm weight], weight, scale, [bias]."""
    from edgekit.kernels.kernel_def import Param
    from edgekit.kernels.launch_rule import ptr

    return (Param("x_ptr", "*act", ptr("x")),
            *((Param("nw_ptr", "*act", ptr("norm_weight")),) if norm else ()),
            Param("w_ptr", w_type, ptr("weight")),
            Param("s_ptr", "*fp32", scale_value),
            *((Param("b_ptr", "*act", ptr("bias")),) if bias else ()))


def int4_params() -> tuple:
    """The trailing runtime parameters of every fused GEMV kernel: INT4 weights' FP16 group scales, offsets (FP16 or
    FP32), scale row stride and flags (null / 0 for float and INT8 weights, whose kernels never read them)."""
    from edgekit.kernels.kernel_def import Param
    from edgekit.kernels.launch_rule import attr, ptr

    return (Param("sh_ptr", "*fp16", ptr("scale_h")),
            Param("oh_ptr", "*fp16", ptr("offset_h")),
            Param("of_ptr", "*fp32", ptr("offset_f")),
            Param("stride_sn", "i32", attr("scale_row_stride")),
            Param("has_offset", "i32", {"add": [{"present": "offset_h"}, {"present": "offset_f"}]}),
            Param("scale_f32", "i32", {"present": "scale_f"}),
            Param("group_shift", "i32", attr("group_shift")))


def reduction_params(k_name: str) -> tuple:
    """The reduction length and the row strides of x and the weight, as every fused GEMV kernel takes them."""
    from edgekit.kernels.kernel_def import Param
    from edgekit.kernels.launch_rule import shape, stride

    return (Param(k_name, "i32", shape("x", 1), div16=True),
            Param("stride_xm", "i32", stride("x", 0), div16=True),
            Param("stride_wn", "i32", stride("weight", 0), div16=True))


def weight_format_expr(int4: bool = True) -> dict:
    """The call's weight format as a launch-rule expression: 0 float (no scale), 1 INT8 (a channel scale in
    ``scale``), 2 INT4 (group scales in ``scale_h`` or ``scale_f``), as the host step (``weight_operands``) fills
    the slots. Without ``int4`` (an operator with no INT4 inputs): the scale's presence alone."""
    if not int4:
        return {"present": "scale"}
    return {"add": [{"present": "scale"},
                    {"mul": [2, {"add": [{"present": "scale_h"}, {"present": "scale_f"}]}]}]}


def weight_columns() -> dict:
    """The weight's columns as a launch-rule expression: its stored columns, times two for packed INT4 (its group
    scales in ``scale_h`` or ``scale_f``: two weights a byte)."""
    per_col = {"add": [1, {"present": "scale_h"}, {"present": "scale_f"}]}  # weights a stored column holds
    return {"mul": [{"shape": ["weight", 1]}, per_col]}


def weight_columns_check(k, what: str) -> dict:
    """A program check that the weight holds ``k`` columns (INT4: k / 2 bytes a row, two weights a byte)."""
    from edgekit.kernels.launch_rule import check

    return check("eq", weight_columns(), k, what)


def format_launches(op: str, kernels, variants, grid_of) -> tuple[list[dict], list[dict]]:
    """Launches of whichever of the format kernels (float, INT8, INT4) were compiled, each taken when the call's
    weights are in its format (``weight_format_expr``), plus checks that refuse a call whose weight format has no
    compiled kernel, naming the formats that do."""
    from edgekit.kernels.kernel_def import launch_of
    from edgekit.kernels.launch_rule import check

    fmt = weight_format_expr(int4=any(k.fixed["W_FORMAT"] == INT4 for k in kernels))
    launches, checks = [], []
    built = [FORMAT_NAMES[k.fixed["W_FORMAT"]] for k in kernels if k.kernel in variants]
    for kdef in kernels:
        code = kdef.fixed["W_FORMAT"]
        if kdef.kernel in variants:
            launches.append(launch_of(kdef, grid_of(variants[kdef.kernel]), when={"cmp": "eq", "a": fmt, "b": code}))
        else:
            checks.append(check("ne", fmt, code, f"{op}: no kernel for {FORMAT_NAMES[code]} weights was built "
                                                 f"(this build has {', '.join(built)}): pass weights in a built format"))
    return launches, checks


