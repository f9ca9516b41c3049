"""Split-KV decode attention with its combine, then the output projection + residual, as two Triton kernels.

Reference: ``kernels/fused_attn_proj_residual.py``. Launch 1 (``_attn_split_combine_kernel``) is the split-KV
kernel of ``attention_decode`` (``attention_triton._attn_decode_split_program``: one program per (split, batch,
KV head), FP32 partial outputs and log-sum-exps in a workspace) followed by its combine: each program counts
itself in at its (batch, KV head)'s arrival counter (``arrivals``, an input: zero before the call, left at zero),
and the last of the group's NUM_SPLITS programs merges the group's partials (``_combine_heads``: only the splits
that hold keys) and writes the heads' attention output ``o``, rounded to the activation dtype as the combine
kernel of ``attention_decode`` writes it. Launch 2 is the plain GEMV + residual of ``fused_proj_residual`` on
``o``. Grid: (NUM_SPLITS, B * Hkv) then (cdiv(N, BLOCK_N), B).

Why a counter and not the combine inside every projection program (the first design): every projection program
re-read the whole row's
partials, more bytes from L2 than its weight tile (H200, llama-3.2-1b, depth 512: 7.1 us for an 8 MB projection,
28% of the copy bandwidth). The counters are the caller's, like the KV cache (``StaticKVCache.split_arrivals``):
two calls that run at the same time on one set of counters would merge each other's splits.
"""

from __future__ import annotations

import dataclasses

import triton
import triton.language as tl

from edgekit.kernels.attention_triton import (
    ATTN_DECODE_SPLIT, _attn_decode_split_program, _decode_default, _decode_space, _prefetch_split_kv, num_splits_rule,
    split_chunk,
)
from edgekit.kernels.fused_gemv_triton import (
    INT4_ATTRS, INT4_INPUTS, format_launches,
    int4_params, weight_columns_check, weight_kernels,
)
from edgekit.kernels.fused_proj_residual_triton import _default as _proj_default
from edgekit.kernels.fused_proj_residual_triton import _proj_residual_kernel
from edgekit.kernels.fused_proj_residual_triton import _space as _proj_space
from edgekit.kernels.kernel_def import OpKernels, Param, launch_of, pow2_at_least, program_doc
from edgekit.kernels.launch_rule import attr, cdiv, check, mul, ptr, shape, stride, sym
from edgekit.kernels.pdl_triton import _pdl_enter
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.fused_attn_proj_residual import prepare

OP_NAME = "fused_attn_proj_residual"


@triton.jit
def _combine_heads(part_ptr, lse_ptr, row, hmask, n_live,
                   HB: tl.constexpr, HEAD_DIM: tl.constexpr, SPLIT_STEP: tl.constexpr):
    """(HB, HEAD_DIM) FP32 attention outputs of the heads whose first workspace rows are ``row`` (HB,), from the
    split-KV partials of splits [0, n_live): sum_s w_s o_s / sum_s w_s, w_s = 2^lse_s, merged online (running max,
    as flash attention) so that a step's log-sum-exps and partials are loaded together, not one after the other.
    Heads outside ``hmask`` (and heads without keys) give zeros."""
    m = tl.full((HB,), float("-inf"), dtype=tl.float32)
    den = tl.zeros((HB,), dtype=tl.float32)
    num = tl.zeros((HB, HEAD_DIM), dtype=tl.float32)
    d = tl.arange(0, HEAD_DIM)
    for s0 in range(0, n_live, SPLIT_STEP):
        s = s0 + tl.arange(0, SPLIT_STEP)
        smask = hmask[:, None] & (s < n_live)[None, :]  # (HB, SPLIT_STEP)
        ls = tl.load(lse_ptr + row[:, None] + s[None, :], mask=smask, other=float("-inf"), cache_modifier=".cg")
        o = tl.load(part_ptr + (row[:, None, None] + s[None, :, None]) * HEAD_DIM + d[None, None, :],
                    mask=smask[:, :, None], other=0.0, cache_modifier=".cg")  # (HB, SPLIT_STEP, D)
        m_new = tl.maximum(m, tl.max(ls, axis=1))  # log2 units; -inf marks an empty split
        base = tl.where(m_new == float("-inf"), 0.0, m_new)  # no split with keys yet: no NaN
        alpha = tl.exp2(m - base)
        w = tl.exp2(ls - base[:, None])  # (HB, SPLIT_STEP)
        den = den * alpha + tl.sum(w, axis=1)
        num = num * alpha[:, None] + tl.sum(w[:, :, None] * o, axis=1)
        m = m_new
    den = tl.where(hmask & (den > 0), den, 1.0)
    return num / den[:, None]


@triton.jit
def live_splits(seq_lens_ptr, b, S, n_splits, BLOCK_N: tl.constexpr):
    """Splits of sequence ``b`` that hold keys: [0, n_live), as ``_attn_decode_split_program`` cuts the cache
    (``split_chunk``: chunks of whole BLOCK_N blocks); the merge reads only those."""
    seq_len, chunk = split_chunk(seq_lens_ptr, b, S, n_splits, BLOCK_N)
    return tl.cdiv(seq_len, tl.maximum(chunk, 1))


@triton.jit
def _attn_split_combine_kernel(
    q_ptr, k_ptr, v_ptr, seq_lens_ptr, o_part_ptr, lse_ptr, sm_scale,
    stride_qb, stride_qh, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
    Hkv, GROUP, S, NUM_SPLITS, arrivals_ptr, o_ptr,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, MAX_SPLITS: tl.constexpr,
    COMBINE_G: tl.constexpr, SPLIT_STEP: tl.constexpr, PDL: tl.constexpr = 0,
):
    """Launch 1: one split of one (batch, KV head); the group's last split to finish also merges the group.

    The merge reads only the splits that hold keys ([0, n_live): split s starts at s * chunk, as the split program
    computes it) in steps of SPLIT_STEP, for COMBINE_G >= GROUP heads (not the tensor cores' BLOCK_G >= 16 rows)."""
    split, bh = tl.program_id(0), tl.program_id(1)
    _prefetch_split_kv(split, bh, k_ptr, v_ptr, seq_lens_ptr, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh,
                       stride_vt, Hkv, S, NUM_SPLITS, HEAD_DIM, BLOCK_N, PDL)
    _pdl_enter(PDL)
    _attn_decode_split_program(
        split, bh, q_ptr, k_ptr, v_ptr, seq_lens_ptr, o_part_ptr, lse_ptr, sm_scale,
        stride_qb, stride_qh, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt, Hkv, GROUP, S, NUM_SPLITS,
        HEAD_DIM, BLOCK_N, BLOCK_G, MAX_SPLITS)
    # what the merge needs besides the partials, read before the counter (not after it, on the last split's path)
    b = (bh // Hkv).to(tl.int64)
    n_live = live_splits(seq_lens_ptr, b, S, NUM_SPLITS, BLOCK_N)
    tl.debug_barrier()  # every thread's partial stores come before the release below
    if tl.atomic_add(arrivals_ptr + bh, 1, sem="acq_rel", scope="gpu") == NUM_SPLITS - 1:
        tl.debug_barrier()  # the acquire above comes before every thread's partial loads
        offs_g = tl.arange(0, COMBINE_G)
        heads = (bh % Hkv) * GROUP + offs_g  # (COMBINE_G,) query heads of this KV head
        g_mask = offs_g < GROUP
        row = (b * Hkv * GROUP + heads) * MAX_SPLITS
        o = _combine_heads(o_part_ptr, lse_ptr, row, g_mask, n_live, COMBINE_G, HEAD_DIM, SPLIT_STEP)
        d = tl.arange(0, HEAD_DIM)
        tl.store(o_ptr + (b * Hkv * GROUP + heads)[:, None] * HEAD_DIM + d[None, :], o.to(o_ptr.dtype.element_ty),
                 mask=g_mask[:, None])
        tl.atomic_xchg(arrivals_ptr + bh, 0, sem="relaxed", scope="gpu")  # every split has arrived: left at zero


def _combine_g(s: dict) -> int:
    return pow2_at_least(max(1, int(s.get("n_heads", 1)) // max(1, int(s.get("n_kv_heads", 1)))), 1)


def _combine_step(s: dict, ms: int) -> int:
    """Splits a merge step loads: up to 8 (depth 512: the 4-5 that hold keys in one step) where COMBINE_G x
    SPLIT_STEP x HEAD_DIM FP32 fit 4096 (32 registers a thread at 4 warps). ptxas, sm_90, head_dim 64: 16 splits
    of one head spilled 4 bytes; 2-8 splits of 1 or 4 heads take 96-107 registers, no spills (sm_87: 87-96)."""
    d = int(s.get("head_dim") or 64)
    return max(1, min(ms, 8, 4096 // (_combine_g(s) * d)))


def _split_default(s: dict):
    c, w, n = _decode_default(s)
    return {**c, "COMBINE_G": _combine_g(s), "SPLIT_STEP": _combine_step(s, c["MAX_SPLITS"])}, w, n


SPLIT = dataclasses.replace(
    ATTN_DECODE_SPLIT, op=OP_NAME, kernel="attn_split_combine", fn=_attn_split_combine_kernel,
    params=tuple(dataclasses.replace(p, value=attr("sm_scale")) if p.name == "sm_scale" else p
                 for p in ATTN_DECODE_SPLIT.params)
    + (Param("arrivals_ptr", "*i32", ptr("arrivals")), Param("o_ptr", "*act", ptr("o"))),
    constexpr_names=ATTN_DECODE_SPLIT.constexpr_names + ("COMBINE_G", "SPLIT_STEP"),
    precision={"input": "{act}", "accumulate": "fp32 (scores, softmax, P@V, the merge)",
               "output": "{act} attention output (FP32 partials + log-sum-exps in between)"},
    space=lambda s: [({**c, "COMBINE_G": _combine_g(s), "SPLIT_STEP": st}, w, n) for c, w, n in _decode_space(s)
                     for st in sorted({2, _combine_step(s, c["MAX_SPLITS"])})],
    default=_split_default,
)


def o_proj_params(residual: bool):
    """The output GEMV's parameters, its x being the attention output ``o``: fused_proj_residual's kernel (with
    ``residual``), or fused_attn_proj's GEMV without one."""
    def params(w_type: str, scale_value) -> tuple[Param, ...]:
        def only_residual(*ps):
            return ps if residual else ()

        return (
            Param("x_ptr", "*act", ptr("o")),
            Param("w_ptr", w_type, ptr("weight")),
            Param("s_ptr", "*fp32", scale_value),
            Param("b_ptr", "*act", ptr("bias")),
            *only_residual(Param("r_ptr", "*act", ptr("residual"))),
            Param("y_ptr", "*act", ptr("y")),
            Param("N", "i32", shape("weight", 0)),
            Param("K", "i32", shape("o", 1), div16=True),  # INT4 weights hold K / 2 bytes a row
            Param("stride_xm", "i32", stride("o", 0), div16=True),
            Param("stride_wn", "i32", stride("weight", 0), div16=True),
            *only_residual(Param("stride_rm", "i32", stride("residual", 0), div16=True)),
            Param("stride_ym", "i32", stride("y", 0), div16=True),
            Param("has_bias", "i32", {"present": "bias"}),
            *int4_params(),
        )

    return params


_params = o_proj_params(residual=True)


FP, W8, W4 = weight_kernels(OP_NAME, "attn_o_proj_residual", _proj_residual_kernel, _params, ("BLOCK_N", "BLOCK_K"),
                            _proj_space, _proj_default, default_w4=lambda s: _proj_default(s, int4=True))


def attn_proj_program(op: str, split, kernels: tuple, residual: bool):
    """The launch program of split-KV attention (``split``) then the output GEMV (``kernels``: float, INT8, INT4),
    adding ``residual`` (this operator) or not (fused_attn_proj)."""
    def program(variants) -> dict:
        cs = variants[split.kernel].constexprs
        B, Hq, Hkv = shape("q", 0), shape("q", 1), shape("k_cache", 1)
        D, MS = cs["HEAD_DIM"], cs["MAX_SPLITS"]

        launches, checks = format_launches(op, kernels, variants,
                                           lambda v: [cdiv(shape("weight", 0), v.constexprs["BLOCK_N"]), B, 1])
        return program_doc(
            op, ["q", "k_cache", "v_cache", "seq_lens", "arrivals", "weight", "scale", *INT4_INPUTS, "bias",
                 *(["residual"] if residual else [])],
            ["scale", *INT4_INPUTS, "bias"], ["sm_scale", *INT4_ATTRS],
            checks=checks + [
                check("eq", shape("q", 2), D, f"head_dim must equal the compiled HEAD_DIM {D}"),
                check("le", {"floordiv": [Hq, Hkv]}, cs["BLOCK_G"],
                      f"query heads per KV head must fit BLOCK_G {cs['BLOCK_G']}"),
                check("le", {"floordiv": [Hq, Hkv]}, cs["COMBINE_G"],
                      f"query heads per KV head must fit COMBINE_G {cs['COMBINE_G']}"),
                check("eq", shape("arrivals", 0), B, "arrivals must hold one counter per (sequence, KV head)"),
                check("eq", shape("arrivals", 1), Hkv, "arrivals must hold one counter per (sequence, KV head)"),
                weight_columns_check(mul(Hq, D), "weight columns must equal n_heads * head_dim"),
                *([check("eq", shape("residual", 1), shape("weight", 0), "residual width must equal weight rows")]
                  if residual else []),
            ],
            let=[["NUM_SPLITS", num_splits_rule(cs)]],  # attention_decode's split count
            buffers=[
                {"name": "o_part", "shape": [B, Hq, MS, D], "dtype": "fp32"},
                {"name": "lse", "shape": [B, Hq, MS], "dtype": "fp32"},
                {"name": "o", "shape": [B, mul(Hq, D)], "dtype": {"like": "q"}},
                {"name": "y", "shape": [B, shape("weight", 0)], "dtype": {"like": "q"}},
            ],
            launches=[launch_of(split, [sym("NUM_SPLITS"), mul(B, Hkv), 1])] + launches,
            outputs=["y"],
        )

    return program


program = attn_proj_program(OP_NAME, SPLIT, (FP, W8, W4), residual=True)
OP = OpKernels(op=OP_NAME, kernels=(SPLIT, FP, W8, W4), program=program, prepare=prepare,
               required=((SPLIT.kernel,), (FP.kernel, W8.kernel, W4.kernel)))
