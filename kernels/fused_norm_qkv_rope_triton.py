"""RMSNorm -> QKV GEMV (+bias) -> RoPE -> KV-cache write, as one Triton kernel per decode step and layer.

Reference: ``kernels/fused_norm_qkv_rope.py``. A program owns PAIRS rotation
pairs of one head: the weight rows j and j + D/2 for j in [j0, j0 + PAIRS),
loaded interleaved so one pass over K yields both halves of each pair, and the
rotation needs no data exchange. Q heads go to the q buffer; K heads (rotated)
and V heads (not rotated) are written straight into the cache at the
sequence's position. Grid: ((Hq + 2 Hkv) * D / (2 PAIRS), B).
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgekit.kernels.fused_gemv_triton import (
    INT4_ATTRS, INT4_INPUTS, _epilogue_apply, _epilogue_operands, _gemv_rows, _pdl_enter_gemv, format_launches,
    gemv_tile, int4_params, operand_params, reduction_params, weight_kernels,
)
from edgekit.kernels.kernel_def import OpKernels, Param, program_doc
from edgekit.kernels.launch_rule import attr, check, mul, ptr, shape, stride
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.fused_norm_qkv_rope import prepare

OP_NAME = "fused_norm_qkv_rope"


@triton.jit
def _norm_qkv_rope_kernel(
    x_ptr, nw_ptr, w_ptr, s_ptr, b_ptr, cos_ptr, sin_ptr, pos_ptr, kc_ptr, vc_ptr, q_ptr,
    C, stride_xm, stride_wn, stride_cs, stride_kb, stride_kh, stride_ks, stride_qb, has_bias, eps, n_heads, n_kv_heads,
    sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift,
    HALF: tl.constexpr, PAIRS: tl.constexpr, BLOCK_K: tl.constexpr, W_FORMAT: tl.constexpr, STAGES: tl.constexpr = 1,
    PDL: tl.constexpr = 0,
):
    _pdl_enter_gemv(w_ptr, _qkv_rows(tl.program_id(0), HALF, PAIRS), C, stride_wn, BLOCK_K, W_FORMAT, PDL)
    _norm_qkv_rope_program(
        tl.program_id(0), tl.program_id(1).to(tl.int64), x_ptr, nw_ptr, w_ptr, s_ptr, b_ptr, cos_ptr, sin_ptr,
        pos_ptr, kc_ptr, vc_ptr, q_ptr, C, stride_xm, stride_wn, stride_cs, stride_kb, stride_kh, stride_ks,
        stride_qb, has_bias, eps, n_heads, n_kv_heads, HALF, PAIRS, BLOCK_K, W_FORMAT, sh_ptr, oh_ptr, of_ptr,
        stride_sn, has_offset, scale_f32, group_shift, STAGES)


@triton.jit
def _qkv_rows(pid, HALF: tl.constexpr, PAIRS: tl.constexpr):
    """The weight rows of program ``pid`` (PAIRS rotation pairs of one head), interleaved: (j, j + D/2) for each j."""
    head = pid // (HALF // PAIRS)
    j0 = (pid % (HALF // PAIRS)) * PAIRS
    r = tl.arange(0, 2 * PAIRS)
    return head * (2 * HALF) + j0 + r // 2 + (r % 2) * HALF


@triton.jit
def _norm_qkv_rope_program(
    pid, b,
    x_ptr, nw_ptr, w_ptr, s_ptr, b_ptr, cos_ptr, sin_ptr, pos_ptr, kc_ptr, vc_ptr, q_ptr,
    C, stride_xm, stride_wn, stride_cs, stride_kb, stride_kh, stride_ks, stride_qb, has_bias, eps, n_heads, n_kv_heads,
    HALF: tl.constexpr, PAIRS: tl.constexpr, BLOCK_K: tl.constexpr, W_FORMAT: tl.constexpr,
    sh_ptr=0, oh_ptr=0, of_ptr=0, stride_sn=0, has_offset=0, scale_f32=0, group_shift=0, STAGES: tl.constexpr = 1,
):
    """Program ``pid`` (PAIRS rotation pairs of one head) of sequence ``b`` (float and INT8 weights leave the INT4
    operands after W_FORMAT at their defaults)."""
    head = pid // (HALF // PAIRS)
    j0 = (pid % (HALF // PAIRS)) * PAIRS
    rows = _qkv_rows(pid, HALF, PAIRS)
    x_row = x_ptr + b * stride_xm
    # the epilogue's operands first: their loads (position, then its cos / sin rows) overlap the weight stream
    scale, bias = _epilogue_operands(s_ptr, b_ptr, rows, has_bias, W_FORMAT)
    pos = tl.load(pos_ptr + b)
    j = j0 + tl.arange(0, PAIRS)
    c = tl.load(cos_ptr + pos * stride_cs + j)
    s = tl.load(sin_ptr + pos * stride_cs + j)
    acc = _gemv_rows(x_row, nw_ptr, eps, w_ptr, rows, C, stride_wn, True, W_FORMAT, 2 * PAIRS, BLOCK_K,
                     s_ptr, sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift, STAGES=STAGES,
                     NORM_FACTORED=1)  # the norm's scale after the sum: _norm_gemv_rows_float says why
    y = _epilogue_apply(acc, scale, bias, has_bias, W_FORMAT, x_ptr.dtype.element_ty)  # (2 PAIRS,) qkv as rounded
    x1, x2 = tl.split(tl.reshape(y, (PAIRS, 2)))  # first and second half of each pair
    rotated = head < n_heads + n_kv_heads  # Q and K heads rotate, V heads do not
    o1 = tl.where(rotated, x1 * c - x2 * s, x1).to(q_ptr.dtype.element_ty)
    o2 = tl.where(rotated, x2 * c + x1 * s, x2).to(q_ptr.dtype.element_ty)
    if head < n_heads:
        dst = q_ptr + b * stride_qb + head * (2 * HALF) + j
    elif head < n_heads + n_kv_heads:
        dst = kc_ptr + b * stride_kb + (head - n_heads) * stride_kh + pos * stride_ks + j
    else:
        dst = vc_ptr + b * stride_kb + (head - n_heads - n_kv_heads) * stride_kh + pos * stride_ks + j
    tl.store(dst, o1)
    tl.store(dst + HALF, o2)


def qkv_params(w_type: str, scale_value, qk_norm: bool = False) -> tuple[Param, ...]:
    """The kernel parameters of this operator, or (``qk_norm``) of fused_norm_qkv_qknorm_rope: the same with its
    per-head norm weights, cache slots, group counters and workspace, and the QK-norm's eps."""
    def only_qk(*params):
        return params if qk_norm else ()

    return (
        *operand_params(w_type, scale_value, norm=True, bias=True),
        *only_qk(Param("qn_ptr", "*act", ptr("q_norm")), Param("kn_ptr", "*act", ptr("k_norm"))),
        Param("cos_ptr", "*fp32", ptr("cos")),
        Param("sin_ptr", "*fp32", ptr("sin")),
        Param("pos_ptr", "*i64", ptr("positions")),
        *only_qk(Param("slot_ptr", "*i64", ptr("slots"))),
        Param("kc_ptr", "*act", ptr("k_cache")),
        Param("vc_ptr", "*act", ptr("v_cache")),
        *only_qk(Param("arr_ptr", "*i32", ptr("arrivals")), Param("ws_ptr", "*act", ptr("qk_rows"))),
        Param("q_ptr", "*act", ptr("q")),
        *reduction_params("C"),
        Param("stride_cs", "i32", stride("cos", 0)),
        Param("stride_kb", "i32", stride("k_cache", 0), div16=True),
        Param("stride_kh", "i32", stride("k_cache", 1), div16=True),
        Param("stride_ks", "i32", stride("k_cache", 2), div16=True),
        Param("stride_qb", "i32", stride("q", 0), div16=True),
        Param("has_bias", "i32", {"present": "bias"}),
        Param("eps", "fp32", attr("eps")),
        *only_qk(Param("qk_eps", "fp32", attr("qk_eps"))),
        Param("n_heads", "i32", attr("n_heads")),
        Param("n_kv_heads", "i32", attr("n_kv_heads")),
        *int4_params(),
    )


def _space(s: dict) -> list:
    half = int(s.get("head_dim") or 64) // 2
    return [({"HALF": half, "PAIRS": p, "BLOCK_K": bk}, w, 1)
            for p in (2, 4, 8, 16) for bk in (128, 256, 512, 1024, 2048) for w in (4, 8) if p <= half]


def _default(s: dict, int4: bool = False):
    half = int(s.get("head_dim") or 64) // 2
    rows, block_k, warps = gemv_tile(s, int4=int4)
    return {"HALF": half, "PAIRS": max(1, min(rows // 2, half)), "BLOCK_K": block_k}, warps, 1


FP, W8, W4 = weight_kernels(OP_NAME, "norm_qkv_rope", _norm_qkv_rope_kernel, qkv_params,
                            ("HALF", "PAIRS", "BLOCK_K"), _space, _default, default_w4=lambda s: _default(s, int4=True),
                            rows_a_step=lambda c: 2 * c["PAIRS"])  # both halves of each rotation pair


def program(variants) -> dict:
    heads = {"add": [attr("n_heads"), mul(2, attr("n_kv_heads"))]}

    def grid(v):
        return [mul(heads, v.constexprs["HALF"] // v.constexprs["PAIRS"]), shape("x", 0), 1]

    launches, checks = format_launches(OP_NAME, (FP, W8, W4), variants, grid)
    half = next(iter(variants.values())).constexprs["HALF"]
    return program_doc(
        OP_NAME, ["x", "norm_weight", "weight", "scale", *INT4_INPUTS, "bias", "cos", "sin", "positions", "k_cache",
                  "v_cache"],
        ["scale", *INT4_INPUTS, "bias"], ["eps", "n_heads", "n_kv_heads", *INT4_ATTRS],
        checks=checks + [
            check("eq", shape("cos", 1), half, "the kernel was compiled for another head_dim (cos is (S, D/2))"),
            check("eq", shape("weight", 0), mul(heads, 2 * half), "weight rows must be (n_heads + 2 n_kv_heads) * head_dim"),
            check("eq", shape("k_cache", 3), 2 * half, "the cache's head_dim must match the compiled one"),
        ],
        let=[],
        buffers=[{"name": "q", "shape": [shape("x", 0), attr("n_heads"), 2 * half], "dtype": {"like": "x"}}],
        launches=launches,
        outputs=["q"],
    )


OP = OpKernels(op=OP_NAME, kernels=(FP, W8, W4), program=program, prepare=prepare,
               required=((FP.kernel, W8.kernel, W4.kernel),))
