"""Grouped-query attention as Triton kernels: flash-style prefill and split-KV (flash-decoding) decode.

References and the masking rule: ``kernels/attention.py`` (key j is visible to
query i of sequence b when j <= i (prefill) and j < seq_lens[b]; with a
sliding window W > 0 also i - j < W).

Prefill (``_attn_prefill_kernel``): one program per (BLOCK_M query rows, batch,
query head). Scores and the online softmax are FP32 (exp2 with the scale
folded into log2 units); P is rounded to the activation dtype for the P @ V
tensor-core product, which accumulates in FP32. Key blocks wholly visible to
every row of the tile run without masks; only the diagonal block and the block
holding seq_lens[b] pay for masking, and blocks past seq_lens[b] are skipped.
With a window, key blocks wholly before every row's window are skipped too,
and the blocks its lower edge cuts through are masked.

Decode: the static cache (B, Hkv, S, D) is split along S. ``_attn_decode_split_kernel``
runs one program per (split, batch, KV head) and serves all G query heads of
that KV head from one read of K and V (the G rows are padded to BLOCK_G >= 16
for the tensor cores); the split length is computed on the device from
seq_lens[b], so a CUDA graph captured once stays balanced as the sequence
grows. ``_attn_decode_reduce_kernel`` merges the splits with their
log-sum-exps. NUM_SPLITS comes from the launch rule: enough programs to fill
the device's SMs at batch 1.
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgekit.errors import OperatorError
from edgekit.kernels.attention import DECODE_PROGRAMS_PER_SM, decode_splits, decode_waves
from edgekit.kernels.kernel_def import KernelDef, OpKernels, Param, launch_of, pow2_at_least, program_doc
from edgekit.kernels.launch_rule import attr, cdiv, check, mul, ptr, shape, stride, sym
from edgekit.kernels.pdl_triton import _pdl_enter, _prefetch_rows_l2
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.attention import prepare_decode, prepare_prefill

LOG2E = 1.4426950408889634
# DECODE_PROGRAMS_PER_SM (split-KV occupancy target) is kernels/attention.py's: the planner reads it there


@triton.jit
def _prefill_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, offs_n, offs_d, seq_len, window,
                   qk_scale, lo, hi, MASKED: tl.constexpr, BLOCK_N: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n  # (BLOCK_N,)
        if MASKED:
            kv_mask = (cols < seq_len)[:, None]
            k = tl.load(k_base + cols[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)  # (BN, D)
        else:
            k = tl.load(k_base + cols[:, None] * stride_kt + offs_d[None, :])
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale  # (BM, BN), log2 units
        if MASKED:
            allowed = (cols[None, :] <= offs_m[:, None]) & (cols[None, :] < seq_len)
            allowed = allowed & (offs_m[:, None] - cols[None, :] < window)
            qk = tl.where(allowed, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        if MASKED:  # a row that has seen no key yet (a sliding window's cut block): -inf - -inf would be NaN
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_ref = m_new
        p = tl.exp2(qk - m_ref[:, None])
        alpha = tl.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)
        else:
            v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :])
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_prefill_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, seq_lens_ptr, sm_scale,
    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
    stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot,
    H, T, GROUP, WINDOW,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Longest tiles (latest query rows) first: causal work grows with the row index.
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    hk = h // GROUP
    seq_len = tl.minimum(tl.load(seq_lens_ptr + b), T)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :],
                mask=(offs_m < T)[:, None], other=0.0)  # (BM, D)
    k_base = k_ptr + b * stride_kb + hk * stride_kh
    v_base = v_ptr + b * stride_vb + hk * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    hi = tl.minimum((start_m + 1) * BLOCK_M, seq_len)
    lo_masked = tl.minimum(start_m * BLOCK_M, seq_len) // BLOCK_N * BLOCK_N
    # Sliding window (WINDOW > 0): keys before the first row's window are skipped; blocks that start before the
    # last row's window (first key last_row - WINDOW + 1) are masked; the rest up to the diagonal run unmasked.
    # WINDOW = 0 (full attention) makes every bound 0: the plain causal loops above.
    window = tl.where(WINDOW > 0, WINDOW, T + BLOCK_M)  # no row is T + BLOCK_M past a key
    lo_window = tl.maximum(start_m * BLOCK_M - window + 1, 0) // BLOCK_N * BLOCK_N
    lo_full = tl.minimum(tl.cdiv(tl.maximum((start_m + 1) * BLOCK_M - window, 0), BLOCK_N) * BLOCK_N, lo_masked)
    lo_window = tl.minimum(lo_window, lo_full)
    acc, l_i, m_i = _prefill_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, offs_n, offs_d,
                                   seq_len, window, qk_scale, lo_window, lo_full, True, BLOCK_N)
    acc, l_i, m_i = _prefill_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, offs_n, offs_d,
                                   seq_len, window, qk_scale, lo_full, lo_masked, False, BLOCK_N)
    acc, l_i, m_i = _prefill_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, offs_n, offs_d,
                                   seq_len, window, qk_scale, lo_masked, hi, True, BLOCK_N)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a padding row past its window sees no key: zeros
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=(offs_m < T)[:, None])


@triton.jit
def _attn_decode_split_kernel(
    q_ptr, k_ptr, v_ptr, seq_lens_ptr, o_part_ptr, lse_ptr, sm_scale,
    stride_qb, stride_qh, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
    Hkv, GROUP, S, NUM_SPLITS,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, MAX_SPLITS: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    _prefetch_split_kv(tl.program_id(0), tl.program_id(1), k_ptr, v_ptr, seq_lens_ptr, stride_kb, stride_kh, stride_kt,
                       stride_vb, stride_vh, stride_vt, Hkv, S, NUM_SPLITS, HEAD_DIM, BLOCK_N, PDL)
    _pdl_enter(PDL)
    _attn_decode_split_program(
        tl.program_id(0), tl.program_id(1), q_ptr, k_ptr, v_ptr, seq_lens_ptr, o_part_ptr, lse_ptr, sm_scale,
        stride_qb, stride_qh, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt, Hkv, GROUP, S, NUM_SPLITS,
        HEAD_DIM, BLOCK_N, BLOCK_G, MAX_SPLITS)


@triton.jit
def split_chunk(seq_lens_ptr, b, S, NUM_SPLITS, BLOCK_N: tl.constexpr):
    """(keys, chunk) of sequence ``b``: its keys (never past the cache) and the rows each split reads, the keys cut in
    NUM_SPLITS chunks of whole BLOCK_N blocks (balanced per sequence, on the device). The one rule the splits
    (``_split_rows``) and the merge that counts them (fused_attn_proj_residual_triton.live_splits) share."""
    seq_len = tl.minimum(tl.load(seq_lens_ptr + b, cache_modifier=".cg"), S)
    return seq_len, tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N


@triton.jit
def _split_rows(seq_lens_ptr, b, S, NUM_SPLITS, split, BLOCK_N: tl.constexpr):
    """[start, end) of the cache rows split ``split`` of sequence ``b`` reads (``split_chunk``)."""
    seq_len, chunk = split_chunk(seq_lens_ptr, b, S, NUM_SPLITS, BLOCK_N)
    start = split * chunk
    return start, tl.minimum(start + chunk, seq_len)


@triton.jit
def _prefetch_split_kv(split, bh, k_ptr, v_ptr, seq_lens_ptr, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh,
                       stride_vt, Hkv, S, NUM_SPLITS, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                       PDL: tl.constexpr):
    """At PDL level 2, before the wait: ask L2 for the program's first key and value tile. Only what the kernel before
    (the QKV operator) does not write is read: the sequence lengths (made at the step's start) and the cache rows
    (the newest row, which it does write, may come in early or late: a prefetch only warms L2, the coherent level).
    A split without keys fetches nothing; rows past a split's end fetch its first row again (in bounds)."""
    if PDL == 2:
        b = (bh // Hkv).to(tl.int64)
        hk = (bh % Hkv).to(tl.int64)
        start, end = _split_rows(seq_lens_ptr, b, S, NUM_SPLITS, split, BLOCK_N)
        if start < end:
            rows = start + tl.arange(0, BLOCK_N)
            rows = tl.where(rows < end, rows, start)
            _prefetch_rows_l2(k_ptr + b * stride_kb + hk * stride_kh, rows, HEAD_DIM, stride_kt, HEAD_DIM)
            _prefetch_rows_l2(v_ptr + b * stride_vb + hk * stride_vh, rows, HEAD_DIM, stride_vt, HEAD_DIM)


@triton.jit
def _attn_decode_split_program(
    split, bh, q_ptr, k_ptr, v_ptr, seq_lens_ptr, o_part_ptr, lse_ptr, sm_scale,
    stride_qb, stride_qh, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
    Hkv, GROUP, S, NUM_SPLITS,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, MAX_SPLITS: tl.constexpr,
):
    """One (split, batch x KV head) program of the split-KV decode (q and the newest K/V row are read through L2,
    .cg: the fused QKV operator writes them just before, and L1 is not coherent across programs)."""
    b = (bh // Hkv).to(tl.int64)
    hk = (bh % Hkv).to(tl.int64)
    start, end = _split_rows(seq_lens_ptr, b, S, NUM_SPLITS, split, BLOCK_N)
    offs_g = tl.arange(0, BLOCK_G)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    heads = hk * GROUP + offs_g  # (BG,) query heads served by this KV head
    g_mask = offs_g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=g_mask[:, None], other=0.0,
                cache_modifier=".cg")
    k_base = k_ptr + b * stride_kb + hk * stride_kh
    v_base = v_ptr + b * stride_vb + hk * stride_vh
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        kv_mask = (cols < end)[:, None]
        k = tl.load(k_base + cols[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0,
                    cache_modifier=".cg")  # (BN, D)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale  # (BG, BN)
        qk = tl.where((cols < end)[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0, cache_modifier=".cg")
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
        m_i = m_new
    has_keys = l_i > 0
    l_safe = tl.where(has_keys, l_i, 1.0)
    lse = tl.where(has_keys, m_i + tl.log2(l_safe), float("-inf"))  # log2 units; -inf marks an empty split
    row = (b * Hkv * GROUP + heads) * MAX_SPLITS + split  # workspace (B, Hq, MAX_SPLITS, ...)
    tl.store(o_part_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc / l_safe[:, None], mask=g_mask[:, None])
    tl.store(lse_ptr + row, lse, mask=g_mask)


@triton.jit
def _attn_decode_reduce_kernel(
    o_part_ptr, lse_ptr, o_ptr, stride_ob, stride_oh, Hq, NUM_SPLITS,
    HEAD_DIM: tl.constexpr, MAX_SPLITS: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)
    b = bh // Hq
    h = bh % Hq
    offs_s = tl.arange(0, MAX_SPLITS)
    offs_d = tl.arange(0, HEAD_DIM)
    s_mask = offs_s < NUM_SPLITS
    lse = tl.load(lse_ptr + bh * MAX_SPLITS + offs_s, mask=s_mask, other=float("-inf"))  # (MAX_SPLITS,)
    w = tl.exp2(lse - tl.max(lse, 0))  # empty splits weigh 0
    o = tl.load(o_part_ptr + (bh * MAX_SPLITS + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
                mask=s_mask[:, None], other=0.0)  # (MAX_SPLITS, D)
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty))


# --------------------------------------------------------------------------- definitions
def _head_dim(s: dict) -> int:
    return int(s.get("head_dim") or 64)  # unknown (a companion kernel without HEAD_DIM asks): the common size


def _prefill_space(s: dict) -> list:
    d = _head_dim(s)
    return [
        ({"HEAD_DIM": d, "BLOCK_M": bm, "BLOCK_N": bn}, w, st)
        for bm in (32, 64, 128) for bn in (32, 64, 128) for w in (4, 8) for st in (1, 2, 3, 4)
        if not (bm == 32 and w == 8) and not (bm * d >= 128 * 128 and w == 4 and bn >= 128)
    ]


def _prefill_default(s: dict):
    d = _head_dim(s)
    if d >= 256:
        # Gemma 3: 128 x 64 tiles in 3 stages compile to 212,992 B on sm_87 (262,144 B on sm_90) and spill; 64 x 32
        # in 2 stages take 69,632 B (98,304 B on sm_90), 239 registers, no spills (cross-compiled, Triton 3.x)
        return {"HEAD_DIM": d, "BLOCK_M": 64, "BLOCK_N": 32}, 8, 2
    return {"HEAD_DIM": d, "BLOCK_M": 128, "BLOCK_N": 64}, 8, 3  # 4 warps at BLOCK_M=128 spill on sm_87


def _prefill_smem(c, warps, stages, nbytes):
    # K and V tiles per pipeline stage (K, V, one in flight beyond the one in use), plus Q for the first dot
    d = c["HEAD_DIM"]
    kv = 2 * c["BLOCK_N"] * d * nbytes
    return max(1, stages - 1) * kv + c["BLOCK_M"] * d * nbytes


def _block_g(s: dict) -> int:
    return pow2_at_least(int(s.get("n_heads", 1)) // max(1, int(s.get("n_kv_heads", 1))), 16)


def _decode_space(s: dict) -> list:
    d = _head_dim(s)
    return [
        ({"HEAD_DIM": d, "BLOCK_N": bn, "BLOCK_G": _block_g(s), "MAX_SPLITS": ms}, w, st)
        for bn in (32, 64, 128, 256) for ms in (16, 32, 64, 128) for w in (2, 4, 8) for st in (1, 2, 3, 4)
        if bn * d <= 256 * 64 * (w // 2 if w > 2 else 1) * 2
    ]


def _decode_max_splits(s: dict) -> int:
    """MAX_SPLITS of the decode kernels: the ``max_splits`` fact where the split kernel's is already chosen (the
    reduce reads its workspace), else the default."""
    if s.get("max_splits"):
        return int(s["max_splits"])
    # H200 sweep (batch 1, 8k context): 16 splits best with 8 KV heads, 64 with 2: about 128 split programs.
    # More splits only add partials for the reduce kernel to read.
    return min(64, max(16, pow2_at_least(-(-128 // max(1, int(s.get("n_kv_heads", 8)))))))


# The per-block shared memory a default decode tile may stage without a device to ask (a plan cross-compiled for a
# target): the orin profile's 128 KB budget. The JIT path passes the running GPU's opt-in limit instead
# (``shared_bytes_per_block``, kernels/triton_backend.py).
DEFAULT_DECODE_SMEM_BYTES = 128 * 1024


def _decode_default(s: dict):
    """The split kernel's default: the longest key block (at most 128) whose three pipeline stages of K/V tiles fit
    the device's shared memory per block (``shared_bytes_per_block``; else DEFAULT_DECODE_SMEM_BYTES).

    Longer blocks won inside the graphed decode step wherever they fit (H100, step_ab.py, depth 512, interleaved A/B,
    2026-12-05): qwen3-1.7b (head_dim 128) BLOCK_N 128 against 64: fp16 613.0 -> 624.8 tok/s, int8 813.1 -> 834.4,
    int4 900.7 -> 928.0, depth 2048 572.9 -> 596.9; qwen3-0.6b fp16 1096 -> 1141; gemma-3-1b (head_dim 256) BLOCK_N 64
    against 32: 695.1 -> 745.0. Those tiles stage 139,264 and 143,360 B: within an sm_90's 227 KB, over the orin
    budget (FP16 head_dim 128 takes BLOCK_N 64 there, 256 takes 32, as before; FP32 activations, twice the bytes,
    take the next shorter block, where they used to exceed it). Two stages of the longer block lost (609.1 / 714.3
    tok/s). Only sm_90+ GPUs report their room (triton_backend.gpu_tile_facts): measured there only."""
    d = _head_dim(s)
    ms = _decode_max_splits(s)
    budget = int(s.get("shared_bytes_per_block") or DEFAULT_DECODE_SMEM_BYTES)
    nbytes = int(s.get("act_bytes") or 2)
    warps = 4
    block_n = 32
    for bn in (128, 64):
        c = {"HEAD_DIM": d, "BLOCK_N": bn, "BLOCK_G": _block_g(s)}
        if _decode_smem(c, warps, 3, nbytes) <= budget:
            block_n = bn
            break
    c = {"HEAD_DIM": d, "BLOCK_N": block_n, "BLOCK_G": _block_g(s), "MAX_SPLITS": ms}
    return c, warps, decode_stages(s, c, warps, nbytes, budget)


def decode_stages(s: dict, c: dict, warps: int, nbytes: int, budget: int) -> int:
    """The split kernel's default pipeline depth: 3, or where the GPU tells its SMs and an SM's shared memory (the JIT
    path on sm_90+, ``triton_backend.gpu_tile_facts``) the stages (4, 3 or 2) within the block's room that launch the
    most programs the rule can give this kernel (every split it may take) in the fewest waves, the deepest of those:
    the tile solver's split-KV rule (plan/tiles.split_kv_rank_key). One more condition than the planner's: a 4th
    stage only where two such blocks fit an SM. Why: a block that fills an SM leaves the next kernel's programs,
    which the programmatic dependent launch starts early, no room beside it (a plan's blocks stay within the target's
    budget, 128 KB on every shipped target, which is under half an sm_90 SM: the h200 plan's picks pass it).

    Measured (H100, tools/step_ab.py, depth 512 / 4096, fp16, greedy tokens equal, 2026-12-07), 4 or 2 stages against
    3, in the graphed step:
    - 132 SMs, 4 stages (104 KB, two blocks an SM): smollm2-135m +2.4% / +2.0%, llama-3.2-1b +0.2% / +2.1%;
    - 132 SMs, 4 stages at head_dim 128 / 256 (205 KB, one block an SM): qwen3-0.6b -0.6% / -0.4%, gemma-3-1b -0.9% /
      -1.2%, hence the two-blocks condition (they keep 3);
    - 16 SMs, 2 stages (fewer waves than 3): smollm2-135m -0.4% / +3.9%, llama-3.2-1b -0.4% / +0.9%, qwen3-0.6b
      +8.9% / +10.6%, gemma-3-1b -0.3% / +0.3%; 8 SMs (earlier, as tile arms) -0.4% to +5.0%."""
    sms, per_sm = int(s.get("sms") or 0), int(s.get("shared_bytes_per_sm") or 0)
    smem = {st: _decode_smem(c, warps, st, nbytes) for st in (4, 3, 2)}
    fits = [st for st in smem if smem[st] <= budget and (st <= 3 or 2 * smem[st] <= per_sm)]
    if not (sms and per_sm and fits):
        return 3
    rows, kv = max(1, int(s.get("rows") or 1)), max(1, int(s.get("n_kv_heads") or 1))
    programs = decode_splits(sms, rows, kv, 1 << 30, c["BLOCK_N"], c["MAX_SPLITS"]) * rows * kv  # the longest context
    return min(fits, key=lambda st: (decode_waves(programs, sms * (per_sm // smem[st])), -st))


def _reduce_default(s: dict):
    d, ms = _head_dim(s), _decode_max_splits(s)
    # the reduce holds all MAX_SPLITS partial rows of HEAD_DIM floats in registers: at most 128 a thread. 2 warps at
    # 64 x 128 use 153 registers; at 64 x 256 (Gemma 3) they spill 112 B on sm_87, 4 warps use 96 (cross-compiled)
    return {"HEAD_DIM": d, "MAX_SPLITS": ms}, max(2, ms * d // (32 * 128)), 1


def _decode_smem(c, warps, stages, nbytes):
    d = c["HEAD_DIM"]
    return max(1, stages - 1) * 2 * c["BLOCK_N"] * d * nbytes + c["BLOCK_G"] * d * nbytes + 4096


ATTN_PREFILL_FWD = KernelDef(
    op="attention_prefill",
    kernel="attention_prefill_fwd",
    fn=_attn_prefill_kernel,
    params=(
        Param("q_ptr", "*act", ptr("q")), Param("k_ptr", "*act", ptr("k")), Param("v_ptr", "*act", ptr("v")),
        Param("o_ptr", "*act", ptr("o")), Param("seq_lens_ptr", "*i32", ptr("seq_lens")),
        Param("sm_scale", "fp32", attr("scale")),
        *(Param(f"stride_{t}{a}", "i32", stride(t, i), div16=True) for t in "qkvo" for i, a in enumerate("bht")),
        Param("H", "i32", shape("q", 1)), Param("T", "i32", shape("q", 2)),
        Param("GROUP", "i32", {"floordiv": [shape("q", 1), shape("k", 1)]}),
        Param("WINDOW", "i32", attr("window")),
    ),
    constexpr_names=("HEAD_DIM", "BLOCK_M", "BLOCK_N"),
    precision={"input": "{act}", "accumulate": "fp32 (scores, softmax, P@V); P rounded to {act} for the P@V dot",
               "output": "{act}"},
    uses_shared_memory=True,
    space=_prefill_space,
    default=_prefill_default,
    smem_estimate=_prefill_smem,
)

_DECODE_COMMON = dict(uses_shared_memory=True)

ATTN_DECODE_SPLIT = KernelDef(
    op="attention_decode",
    kernel="attention_decode_split",
    fn=_attn_decode_split_kernel,
    params=(
        Param("q_ptr", "*act", ptr("q")), Param("k_ptr", "*act", ptr("k_cache")), Param("v_ptr", "*act", ptr("v_cache")),
        Param("seq_lens_ptr", "*i32", ptr("seq_lens")), Param("o_part_ptr", "*fp32", ptr("o_part")),
        Param("lse_ptr", "*fp32", ptr("lse")), Param("sm_scale", "fp32", attr("scale")),
        Param("stride_qb", "i32", stride("q", 0), div16=True), Param("stride_qh", "i32", stride("q", 1), div16=True),
        *(Param(f"stride_{t[0]}{a}", "i32", stride(t, i), div16=True)
          for t in ("k_cache", "v_cache") for i, a in enumerate("bht")),
        Param("Hkv", "i32", shape("k_cache", 1)),
        Param("GROUP", "i32", {"floordiv": [shape("q", 1), shape("k_cache", 1)]}),
        Param("S", "i32", shape("k_cache", 2)),
        Param("NUM_SPLITS", "i32", sym("NUM_SPLITS")),
    ),
    constexpr_names=("HEAD_DIM", "BLOCK_N", "BLOCK_G", "MAX_SPLITS"),
    precision={"input": "{act}", "accumulate": "fp32 (scores, softmax, P@V); P rounded to {act} for the P@V dot",
               "output": "fp32 partials + log-sum-exp"},
    space=_decode_space,
    default=_decode_default,
    smem_estimate=_decode_smem,
    pdl=True,
    **_DECODE_COMMON,
)

ATTN_DECODE_REDUCE = KernelDef(
    op="attention_decode",
    kernel="attention_decode_reduce",
    fn=_attn_decode_reduce_kernel,
    params=(
        Param("o_part_ptr", "*fp32", ptr("o_part")), Param("lse_ptr", "*fp32", ptr("lse")), Param("o_ptr", "*act", ptr("o")),
        Param("stride_ob", "i32", stride("o", 0), div16=True), Param("stride_oh", "i32", stride("o", 1), div16=True),
        Param("Hq", "i32", shape("q", 1)), Param("NUM_SPLITS", "i32", sym("NUM_SPLITS")),
    ),
    constexpr_names=("HEAD_DIM", "MAX_SPLITS"),
    precision={"input": "fp32 partials", "accumulate": "fp32", "output": "{act}"},
    uses_shared_memory=False,
    space=lambda s: [({"HEAD_DIM": _head_dim(s), "MAX_SPLITS": ms}, w, 1) for ms in (16, 32, 64, 128) for w in (1, 2, 4, 8)],
    default=_reduce_default,
    smem_estimate=lambda c, warps, stages, nbytes: 8 * c["HEAD_DIM"],  # cross-warp reduction over the splits
)


def _head_checks(t: str, axis: int, head_dim: int) -> list[dict]:
    return [check("eq", shape(t, axis), head_dim, f"head_dim must equal the compiled HEAD_DIM {head_dim}")]


def prefill_program(variants) -> dict:
    c = variants["attention_prefill_fwd"].constexprs
    B, Hq, T = shape("q", 0), shape("q", 1), shape("q", 2)
    return program_doc(
        "attention_prefill", ["q", "k", "v", "seq_lens"], [], ["scale", "window"],
        checks=_head_checks("q", 3, c["HEAD_DIM"]),
        let=[],
        buffers=[{"name": "o", "shape": [B, Hq, T, c["HEAD_DIM"]], "dtype": {"like": "q"}}],
        launches=[launch_of(ATTN_PREFILL_FWD, [cdiv(T, c["BLOCK_M"]), mul(B, Hq), 1])],
        outputs=["o"],
    )


def num_splits_rule(split_constexprs) -> dict:
    """NUM_SPLITS of a split-KV launch over q (B, Hq, D) and k_cache (B, Hkv, S, D): enough (split, batch, KV head)
    programs to fill the device, never more splits than key blocks nor MAX_SPLITS (attention.decode_splits)."""
    B, Hkv, S = shape("q", 0), shape("k_cache", 1), shape("k_cache", 2)
    return {"max": [1, {"min": [split_constexprs["MAX_SPLITS"],
                                cdiv(mul(DECODE_PROGRAMS_PER_SM, {"device": "sm_count"}), mul(B, Hkv)),
                                cdiv(S, split_constexprs["BLOCK_N"])]}]}


def decode_program(variants) -> dict:
    cs = variants["attention_decode_split"].constexprs
    cr = variants["attention_decode_reduce"].constexprs
    if cs["MAX_SPLITS"] != cr["MAX_SPLITS"] or cs["HEAD_DIM"] != cr["HEAD_DIM"]:
        raise OperatorError("attention_decode: the split and reduce variants must agree on MAX_SPLITS and HEAD_DIM; "
                            f"got {dict(cs)} and {dict(cr)}")
    B, Hq, Hkv = shape("q", 0), shape("q", 1), shape("k_cache", 1)
    D, MS = cs["HEAD_DIM"], cs["MAX_SPLITS"]
    return program_doc(
        "attention_decode", ["q", "k_cache", "v_cache", "seq_lens"], [], ["scale"],
        checks=_head_checks("q", 2, D) + [
            check("le", {"floordiv": [Hq, Hkv]}, cs["BLOCK_G"], f"query heads per KV head must fit BLOCK_G {cs['BLOCK_G']}"),
        ],
        let=[["NUM_SPLITS", num_splits_rule(cs)]],
        buffers=[
            {"name": "o_part", "shape": [B, Hq, MS, D], "dtype": "fp32"},
            {"name": "lse", "shape": [B, Hq, MS], "dtype": "fp32"},
            {"name": "o", "shape": [B, Hq, D], "dtype": {"like": "q"}},
        ],
        launches=[
            launch_of(ATTN_DECODE_SPLIT, [sym("NUM_SPLITS"), mul(B, Hkv), 1]),
            launch_of(ATTN_DECODE_REDUCE, [mul(B, Hq), 1, 1]),
        ],
        outputs=["o"],
    )


PREFILL_OP = OpKernels("attention_prefill", (ATTN_PREFILL_FWD,), prefill_program, prepare_prefill,
                       required=(("attention_prefill_fwd",),))
DECODE_OP = OpKernels("attention_decode", (ATTN_DECODE_SPLIT, ATTN_DECODE_REDUCE), decode_program, prepare_decode,
                      required=(("attention_decode_split",), ("attention_decode_reduce",)))
