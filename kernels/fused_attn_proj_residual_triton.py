"""Split-KV decode attention, then its combine fused into the output projection + residual, as two Triton kernels.

Reference: ``kernels/fused_attn_proj_residual.py``. Launch 1 is the split-KV
kernel of ``attention_decode`` itself (``attention_triton._attn_decode_split_kernel``:
one program per (split, batch, KV head), FP32 partial outputs and log-sum-exps
in a workspace). Launch 2 replaces both the combine kernel and the projection:
a program owns BLOCK_N output rows and, for each K step of its GEMV, rebuilds
that step's slice of the attention output from the partials
(``_combined_attention``: the combine kernel's arithmetic, rounded to the
activation dtype as the combine kernel writes ``o``) before the FMAs of the
shared ``_gemv_fma`` (its weight tile is loaded first, so the combine hides
behind the weight loads). Every program redoes the combine of the whole row (at
depth 512 a few tens of KB of partials from L2), which is cheaper than a
launch boundary. Grid: (NUM_SPLITS, B * Hkv) then (cdiv(N, BLOCK_N), B).
"""

from __future__ import annotations

import dataclasses

import triton
import triton.language as tl

from edgekit.errors import OperatorError
from edgekit.kernels import host_checks as hc
from edgekit.kernels.attention_triton import (
    ATTN_DECODE_SPLIT, _decode_default, _decode_max_splits, _decode_space, num_splits_rule,
)
from edgekit.kernels.fused_gemv_triton import (
    INT4_ATTRS, INT4_INPUTS, TARGET_PROGRAMS, _epilogue, _gemv_acc, _gemv_fma, _load_weight_tile, _pdl_enter_gemv,
    format_launches, int4_params, weight_columns_check, weight_kernels, weight_operands,
)
from edgekit.kernels.kernel_def import OpKernels, Param, launch_of, pow2_at_least, program_doc
from edgekit.kernels.launch_rule import attr, cdiv, check, mul, ptr, shape, stride, sym

OP_NAME = "fused_attn_proj_residual"


@triton.jit
def _combined_attention(part_ptr, lse_ptr, b, k0, n_heads, n_splits,
                        HEAD_DIM: tl.constexpr, MAX_SPLITS: tl.constexpr, SPLIT_STEP: tl.constexpr,
                        BLOCK_K: tl.constexpr, DTYPE: tl.constexpr):
    """o[b].flatten()[k] for one K step, from the split-KV partials: sum_s w_s o_s / sum_s w_s, w_s = 2^(lse_s - max)."""
    HB: tl.constexpr = BLOCK_K // HEAD_DIM  # whole heads per step (BLOCK_K is a multiple of HEAD_DIM)
    heads = k0 // HEAD_DIM + tl.arange(0, HB)  # (HB,) heads of this step (k0 is a multiple of BLOCK_K)
    hmask = heads < n_heads
    row = (b * n_heads + heads) * MAX_SPLITS  # (HB,) first workspace row of each head
    s_all = tl.arange(0, MAX_SPLITS)
    lse = tl.load(lse_ptr + row[:, None] + s_all[None, :], mask=hmask[:, None] & (s_all < n_splits)[None, :],
                  other=float("-inf"), cache_modifier=".cg")  # (HB, MAX_SPLITS), log2 units; -inf: empty split
    m = tl.max(lse, axis=1)
    m = tl.where(m == float("-inf"), 0.0, m)  # padding heads: no NaN (never used)
    den = tl.sum(tl.exp2(lse - m[:, None]), axis=1)  # (HB,)
    # Splits hold keys in a prefix [0, n_live) (split s starts at s * chunk): the empty ones weigh 0, so their
    # partials are not read. At depth 512 with 16 splits of 128 keys, 4 of 16: one L2 round trip, not four.
    n_live = tl.max(tl.sum((lse > float("-inf")).to(tl.int32), axis=1), axis=0)
    num = tl.zeros((HB, HEAD_DIM), dtype=tl.float32)
    d = tl.arange(0, HEAD_DIM)
    for s0 in range(0, n_live, SPLIT_STEP):
        s = s0 + tl.arange(0, SPLIT_STEP)
        smask = hmask[:, None] & (s < n_splits)[None, :]  # (HB, SPLIT_STEP)
        ls = tl.load(lse_ptr + row[:, None] + s[None, :], mask=smask, other=float("-inf"), cache_modifier=".cg")
        w = tl.exp2(ls - m[:, None])  # (HB, SPLIT_STEP)
        o = tl.load(part_ptr + (row[:, None, None] + s[None, :, None]) * HEAD_DIM + d[None, None, :],
                    mask=smask[:, :, None], other=0.0, cache_modifier=".cg")  # (HB, SPLIT_STEP, D)
        num += tl.sum(w[:, :, None] * o, axis=1)
    den = tl.where(hmask, den, 1.0)
    out = (num / den[:, None]).to(DTYPE)  # rounded as the combine kernel writes o
    return tl.reshape(out, (BLOCK_K,))  # zero past the last head (no partials read)


@triton.jit
def _attn_proj_residual_kernel(
    part_ptr, lse_ptr, w_ptr, s_ptr, b_ptr, r_ptr, y_ptr, N, K, n_heads, n_splits, stride_wn, stride_rm, stride_ym,
    has_bias, sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift,
    HEAD_DIM: tl.constexpr, MAX_SPLITS: tl.constexpr, SPLIT_STEP: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, W_FORMAT: tl.constexpr, PDL: tl.constexpr = 0,
):
    _pdl_enter_gemv(w_ptr, (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)) % N, K, stride_wn, BLOCK_K, W_FORMAT, PDL)
    _attn_proj_residual_program(
        tl.program_id(0), tl.program_id(1).to(tl.int64), part_ptr, lse_ptr, w_ptr, s_ptr, b_ptr, r_ptr, y_ptr, N, K, n_heads,
        n_splits, stride_wn, stride_rm, stride_ym, has_bias, HEAD_DIM, MAX_SPLITS, SPLIT_STEP, BLOCK_N, BLOCK_K,
        W_FORMAT, sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift)


@triton.jit
def _attn_proj_residual_program(
    pid, b,
    part_ptr, lse_ptr, w_ptr, s_ptr, b_ptr, r_ptr, y_ptr, N, K, n_heads, n_splits, stride_wn, stride_rm, stride_ym,
    has_bias,
    HEAD_DIM: tl.constexpr, MAX_SPLITS: tl.constexpr, SPLIT_STEP: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, W_FORMAT: tl.constexpr,
    sh_ptr=0, oh_ptr=0, of_ptr=0, stride_sn=0, has_offset=0, scale_f32=0, group_shift=0,
):
    """Program for BLOCK_N output rows of sequence ``b``; also stage 3 of the persistent decode kernel (float and
    INT8 weights: the INT4 operands after W_FORMAT keep their defaults)."""
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = rows < N
    rows_ld = rows % N  # rows past N read valid memory; never stored
    w_rows = w_ptr + rows_ld.to(tl.int64)[:, None] * stride_wn
    acc = _gemv_acc(BLOCK_N, BLOCK_K, W_FORMAT)
    for k0 in range(0, K, BLOCK_K):
        w = _load_weight_tile(w_rows, k0, K, W_FORMAT, BLOCK_K)  # the weights first: their loads overlap the combine
        x = _combined_attention(part_ptr, lse_ptr, b, k0, n_heads, n_splits, HEAD_DIM, MAX_SPLITS, SPLIT_STEP,
                                BLOCK_K, y_ptr.dtype.element_ty)
        acc = _gemv_fma(acc, w, x, W_FORMAT, BLOCK_N, BLOCK_K, rows_ld, k0, K, s_ptr, sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift)
    y = _epilogue(tl.sum(acc, axis=1), s_ptr, b_ptr, rows_ld, has_bias, W_FORMAT, y_ptr.dtype.element_ty)
    res = tl.load(r_ptr + b * stride_rm + rows, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    tl.store(y_ptr + b * stride_ym + rows, (res + y).to(y_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- definitions
SPLIT = dataclasses.replace(
    ATTN_DECODE_SPLIT, op=OP_NAME, kernel="attn_proj_split",
    params=tuple(dataclasses.replace(p, value=attr("sm_scale")) if p.name == "sm_scale" else p
                 for p in ATTN_DECODE_SPLIT.params),
)


def _params(w_type: str, scale_value) -> tuple[Param, ...]:
    return (
        Param("part_ptr", "*fp32", ptr("o_part")),
        Param("lse_ptr", "*fp32", ptr("lse")),
        Param("w_ptr", w_type, ptr("weight")),
        Param("s_ptr", "*fp32", scale_value),
        Param("b_ptr", "*act", ptr("bias")),
        Param("r_ptr", "*act", ptr("residual")),
        Param("y_ptr", "*act", ptr("y")),
        Param("N", "i32", shape("weight", 0)),
        Param("K", "i32", mul(shape("q", 1), shape("q", 2)), div16=True),  # INT4 weights hold K / 2 bytes a row
        Param("n_heads", "i32", shape("q", 1)),
        Param("n_splits", "i32", sym("NUM_SPLITS")),
        Param("stride_wn", "i32", stride("weight", 0), div16=True),
        Param("stride_rm", "i32", stride("residual", 0), div16=True),
        Param("stride_ym", "i32", stride("y", 0), div16=True),
        Param("has_bias", "i32", {"present": "bias"}),
        *int4_params(),
    )


def proj_tile(s: dict) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps) of the combine + projection kernel: whole heads a K step (up to 2048 columns),
    about one program per SM (each program redoes the combine, so more programs mean more partials read)."""
    d = int(s.get("head_dim") or 64)
    k = int(s.get("k_in") or 2048)
    n = int(s.get("n_out") or 2048)
    block_k = max(d, min(pow2_at_least(k, d), 2048))
    rows = 2
    while rows < 16 and n // (2 * rows) >= TARGET_PROGRAMS:
        rows *= 2
    return rows, block_k, 8


def _space(s: dict) -> list:
    d, ms = int(s.get("head_dim") or 64), _decode_max_splits(s)
    return [({"HEAD_DIM": d, "MAX_SPLITS": ms, "SPLIT_STEP": st, "BLOCK_N": bn, "BLOCK_K": bk}, w, 1)
            for st in (2, 4, 8) for bn in (2, 4, 8, 16) for bk in (512, 1024, 2048) for w in (4, 8) if bk >= d]


def _default(s: dict):
    rows, block_k, warps = proj_tile(s)
    return ({"HEAD_DIM": int(s.get("head_dim") or 64), "MAX_SPLITS": _decode_max_splits(s), "SPLIT_STEP": 4,
             "BLOCK_N": rows, "BLOCK_K": block_k}, warps, 1)


FP, W8, W4 = weight_kernels(OP_NAME, "attn_proj_residual", _attn_proj_residual_kernel, _params,
                            ("HEAD_DIM", "MAX_SPLITS", "SPLIT_STEP", "BLOCK_N", "BLOCK_K"), _space, _default)
SPLIT = dataclasses.replace(SPLIT, space=_decode_space, default=_decode_default)


def program(variants) -> dict:
    cs = variants[SPLIT.kernel].constexprs
    for name, v in variants.items():
        if name != SPLIT.kernel and (v.constexprs["MAX_SPLITS"], v.constexprs["HEAD_DIM"]) != (cs["MAX_SPLITS"], cs["HEAD_DIM"]):
            raise OperatorError(f"{OP_NAME}: the split and projection variants must agree on MAX_SPLITS and HEAD_DIM; "
                                f"got {dict(cs)} and {dict(v.constexprs)}")
    B, Hq, Hkv = shape("q", 0), shape("q", 1), shape("k_cache", 1)
    D, MS = cs["HEAD_DIM"], cs["MAX_SPLITS"]

    launches, checks = format_launches(OP_NAME, (FP, W8, W4), variants,
                                          lambda v: [cdiv(shape("weight", 0), v.constexprs["BLOCK_N"]), B, 1])
    return program_doc(
        OP_NAME, ["q", "k_cache", "v_cache", "seq_lens", "weight", "scale", *INT4_INPUTS, "bias", "residual"],
        ["scale", *INT4_INPUTS, "bias"], ["sm_scale", *INT4_ATTRS],
        checks=checks + [
            check("eq", shape("q", 2), D, f"head_dim must equal the compiled HEAD_DIM {D}"),
            check("le", {"floordiv": [Hq, Hkv]}, cs["BLOCK_G"], f"query heads per KV head must fit BLOCK_G {cs['BLOCK_G']}"),
            weight_columns_check(mul(Hq, D), "weight columns must equal n_heads * head_dim"),
            check("eq", shape("residual", 1), shape("weight", 0), "residual width must equal weight rows"),
        ],
        let=[["NUM_SPLITS", num_splits_rule(cs)]],  # attention_decode's split count
        buffers=[
            {"name": "o_part", "shape": [B, Hq, MS, D], "dtype": "fp32"},
            {"name": "lse", "shape": [B, Hq, MS], "dtype": "fp32"},
            {"name": "y", "shape": [B, shape("weight", 0)], "dtype": {"like": "q"}},
        ],
        launches=[launch_of(SPLIT, [sym("NUM_SPLITS"), mul(B, Hkv), 1])] + launches,
        outputs=["y"],
    )


def prepare(q, k_cache, v_cache, seq_lens, weight, scale, offset, bias, residual, sm_scale=None):
    from edgekit.kernels.attention import default_scale
    from edgekit.kernels.attention_triton import _prepare_heads

    op = OP_NAME
    hc.ndim(op, q, "q", 3, "(B, Hq, D)")
    for n, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        hc.ndim(op, t, n, 4, "(B, Hkv, S, D)")
    _prepare_heads(op, q, k_cache, v_cache, ("q", "k_cache", "v_cache"), 2)
    hc.on_cuda(op, ("weight", weight), ("scale", scale), ("offset", offset), ("bias", bias), ("residual", residual))
    B, Hq, D = q.shape
    if q.stride(1) != D or q.stride(0) != Hq * D:
        raise OperatorError(f"{op}: q has strides {q.stride()}; expected a contiguous (B, Hq, D) tensor")
    N = weight.shape[0] if weight.dim() == 2 else -1
    operands, w_attrs = weight_operands(op, q.reshape(B, Hq * D), weight, scale, offset, N, Hq * D)
    if bias is not None:
        hc.same_dtype(op, bias, "bias", q, "q")
        hc.vector(op, bias, "bias", N)
    hc.same_dtype(op, residual, "residual", q, "q")
    if tuple(residual.shape) != (B, N):
        raise OperatorError(f"{op}: residual has shape {tuple(residual.shape)}; expected ({B}, {N})")
    hc.unit_last_stride(op, residual, "residual")
    sl = hc.seq_lens_i32(op, seq_lens, B)
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "seq_lens": sl, **operands, "bias": bias,
               "residual": residual}
    attrs = {"sm_scale": default_scale(D) if sm_scale is None else float(sm_scale), **w_attrs}
    return tensors, attrs, lambda bufs: bufs["y"]


OP = OpKernels(op=OP_NAME, kernels=(SPLIT, FP, W8, W4), program=program, prepare=prepare,
               required=((SPLIT.kernel,), (FP.kernel, W8.kernel, W4.kernel)))
