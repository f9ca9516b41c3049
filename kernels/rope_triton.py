"""QKV projection fused with RoPE, and RoPE alone, as Triton kernels.

References: ``kernels/rope.py`` (Hugging Face "rotate half" layout). The fused
kernel computes one (BLOCK_M tokens x one head) tile of x @ wqkv.T; the head's
output columns are sub-tiled into its two halves, each its own accumulator of
(BLOCK_M, BLOCK_H), so the rotation [x1*cos - x2*sin | x2*cos + x1*sin] needs
no shuffle between registers, and the weight tiles in shared memory are
2 * BLOCK_K * BLOCK_H per stage, whatever the head count. Heads of Q and K are
rotated, V heads pass through, and each is written straight into its
(B, H, T, D) output: the packed QKV tensor never exists in memory.

The projection is rounded to the activation dtype before rotating, as the
reference does (linear, then rope on the rounded result).
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgekit.kernels.kernel_def import KernelDef, OpKernels, Param, launch_of, program_doc
from edgekit.kernels.launch_rule import cdiv, check, ptr, shape, stride
from edgekit.kernels.launch_rule import attr as _attr
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.rope import prepare_qkv_rope, prepare_rope


@triton.jit
def _rotate_store(a1, a2, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, b_idx, t, head, rh, smask,
                  stride_cb, stride_ct, stride_sb, stride_st,
                  stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
                  Hq, Hkv, HALF: tl.constexpr):
    # a1, a2: (R, BLOCK_H) fp32 halves of one head for R tokens; b_idx, t: (R,) token coordinates
    if head < Hq + Hkv:
        c = tl.load(cos_ptr + b_idx[:, None] * stride_cb + t[:, None] * stride_ct + rh[None, :], mask=smask, other=0.0)
        s = tl.load(sin_ptr + b_idx[:, None] * stride_sb + t[:, None] * stride_st + rh[None, :], mask=smask, other=0.0)
        o1 = a1 * c - a2 * s
        o2 = a2 * c + a1 * s
        if head < Hq:
            base = q_ptr + b_idx[:, None] * stride_qb + head * stride_qh + t[:, None] * stride_qt + rh[None, :]
            tl.store(base, o1.to(q_ptr.dtype.element_ty), mask=smask)
            tl.store(base + HALF, o2.to(q_ptr.dtype.element_ty), mask=smask)
        else:
            base = k_ptr + b_idx[:, None] * stride_kb + (head - Hq) * stride_kh + t[:, None] * stride_kt + rh[None, :]
            tl.store(base, o1.to(k_ptr.dtype.element_ty), mask=smask)
            tl.store(base + HALF, o2.to(k_ptr.dtype.element_ty), mask=smask)
    else:
        base = v_ptr + b_idx[:, None] * stride_vb + (head - Hq - Hkv) * stride_vh + t[:, None] * stride_vt + rh[None, :]
        tl.store(base, a1.to(v_ptr.dtype.element_ty), mask=smask)
        tl.store(base + HALF, a2.to(v_ptr.dtype.element_ty), mask=smask)


@triton.jit
def _qkv_rope_kernel(
    x_ptr, w_ptr, b_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr,
    M, T, C, stride_xm, stride_wn, stride_cb, stride_ct, stride_sb, stride_st,
    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
    Hq, Hkv, has_bias,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr,
):
    HALF: tl.constexpr = HEAD_DIM // 2
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rm_ld = rm % M
    rh = tl.arange(0, BLOCK_H)  # BLOCK_H = max(16, HALF): the tensor cores need 16 columns
    h_mask = rh < HALF
    rk = tl.arange(0, BLOCK_K)
    n1 = head * HEAD_DIM + rh  # weight rows of the first half of this head
    x_ptrs = x_ptr + rm_ld[:, None] * stride_xm + rk[None, :]  # (BM, BK)
    w1_ptrs = w_ptr + n1[None, :] * stride_wn + rk[:, None]  # (BK, BH)
    w2_ptrs = w1_ptrs + HALF * stride_wn
    acc1 = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for k in range(0, tl.cdiv(C, BLOCK_K)):
        k_left = C - k * BLOCK_K
        a = tl.load(x_ptrs, mask=rk[None, :] < k_left, other=0.0)
        w_mask = (rk[:, None] < k_left) & h_mask[None, :]
        w1 = tl.load(w1_ptrs, mask=w_mask, other=0.0)
        w2 = tl.load(w2_ptrs, mask=w_mask, other=0.0)
        acc1 = tl.dot(a, w1, acc1, input_precision="ieee")
        acc2 = tl.dot(a, w2, acc2, input_precision="ieee")
        x_ptrs += BLOCK_K
        w1_ptrs += BLOCK_K
        w2_ptrs += BLOCK_K
    if has_bias != 0:
        acc1 = acc1 + tl.load(b_ptr + n1, mask=h_mask, other=0.0).to(tl.float32)[None, :]
        acc2 = acc2 + tl.load(b_ptr + n1 + HALF, mask=h_mask, other=0.0).to(tl.float32)[None, :]
    a1 = acc1.to(q_ptr.dtype.element_ty).to(tl.float32)  # rounded like the reference's linear output
    a2 = acc2.to(q_ptr.dtype.element_ty).to(tl.float32)
    b_idx = rm_ld // T
    t = rm_ld % T
    smask = (rm < M)[:, None] & h_mask[None, :]
    _rotate_store(a1, a2, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, b_idx, t, head, rh, smask,
                  stride_cb, stride_ct, stride_sb, stride_st,
                  stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
                  Hq, Hkv, HALF)


@triton.jit
def _rope_kernel(
    qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr,
    M, T, stride_xm, stride_cb, stride_ct, stride_sb, stride_st,
    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
    Hq, Hkv,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr,
):
    HALF: tl.constexpr = HEAD_DIM // 2
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    head = tl.program_id(1)
    rm_ld = rm % M
    rh = tl.arange(0, BLOCK_H)
    smask = (rm < M)[:, None] & (rh < HALF)[None, :]
    src = qkv_ptr + rm_ld[:, None] * stride_xm + head * HEAD_DIM + rh[None, :]
    a1 = tl.load(src, mask=smask, other=0.0).to(tl.float32)
    a2 = tl.load(src + HALF, mask=smask, other=0.0).to(tl.float32)
    _rotate_store(a1, a2, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, rm_ld // T, rm_ld % T, head, rh, smask,
                  stride_cb, stride_ct, stride_sb, stride_st,
                  stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
                  Hq, Hkv, HALF)


# --------------------------------------------------------------------------- definitions
def _out_params() -> tuple[Param, ...]:
    return (
        # The tables' strides can be head_dim / 2 elements (a row; the batch stride of a one-token table): 8 for
        # a 16-wide head (the tiny preset), so they are not declared multiples of 16 (a plugin compiled with that
        # assumption refused such a model's tables)
        Param("stride_cb", "i32", stride("cos", 0)), Param("stride_ct", "i32", stride("cos", 1)),
        Param("stride_sb", "i32", stride("sin", 0)), Param("stride_st", "i32", stride("sin", 1)),
        *(Param(f"stride_{t}{a}", "i32", stride(t, i), div16=True) for t in "qkv" for i, a in enumerate("bht")),
        Param("Hq", "i32", _attr("n_heads")), Param("Hkv", "i32", _attr("n_kv_heads")),
    )


def _block_h(d: int) -> int:
    return max(16, d // 2)


def _qkv_space(s: dict) -> list:
    d = int(s["head_dim"])
    m = int(s.get("rows", s.get("M", 256)))
    bms = (16,) if m <= 16 else (16, 32, 64, 128)
    return [
        ({"HEAD_DIM": d, "BLOCK_M": bm, "BLOCK_K": bk, "BLOCK_H": _block_h(d)}, w, st)
        for bm in bms for bk in (32, 64, 128) for w in (4, 8) for st in (2, 3, 4)
        if not (bm <= 32 and w == 8)
    ]


def _qkv_default(s: dict):
    d = int(s["head_dim"])
    m = int(s.get("rows", s.get("M", 256)))
    bm = 16 if m <= 16 else (64 if m <= 128 else 128)
    return {"HEAD_DIM": d, "BLOCK_M": bm, "BLOCK_K": 64, "BLOCK_H": _block_h(d)}, 4 if bm <= 64 else 8, 3


QKV_ROPE_FWD = KernelDef(
    op="qkv_rope",
    kernel="qkv_rope_fwd",
    fn=_qkv_rope_kernel,
    params=(
        Param("x_ptr", "*act", ptr("x")), Param("w_ptr", "*act", ptr("wqkv")), Param("b_ptr", "*act", ptr("bqkv")),
        Param("cos_ptr", "*fp32", ptr("cos")), Param("sin_ptr", "*fp32", ptr("sin")),
        Param("q_ptr", "*act", ptr("q")), Param("k_ptr", "*act", ptr("k")), Param("v_ptr", "*act", ptr("v")),
        Param("M", "i32", shape("x", 0)), Param("T", "i32", _attr("T")), Param("C", "i32", shape("x", 1), div16=True),
        Param("stride_xm", "i32", stride("x", 0), div16=True), Param("stride_wn", "i32", stride("wqkv", 0), div16=True),
        *_out_params(),
        Param("has_bias", "i32", {"present": "bqkv"}),
    ),
    constexpr_names=("HEAD_DIM", "BLOCK_M", "BLOCK_K", "BLOCK_H"),
    precision={"input": "{act}; fp32 cos/sin", "accumulate": "fp32 (projection rounded to {act} before rotating)",
               "output": "{act}"},
    uses_shared_memory=True,
    space=_qkv_space,
    default=_qkv_default,
    smem_estimate=lambda c, warps, stages, nbytes: max(1, stages - 1) * (
        c["BLOCK_M"] * c["BLOCK_K"] + 2 * c["BLOCK_K"] * c["BLOCK_H"]) * nbytes,
)

ROPE_FWD = KernelDef(
    op="rope",
    kernel="rope_fwd",
    fn=_rope_kernel,
    params=(
        Param("qkv_ptr", "*act", ptr("qkv")), Param("cos_ptr", "*fp32", ptr("cos")), Param("sin_ptr", "*fp32", ptr("sin")),
        Param("q_ptr", "*act", ptr("q")), Param("k_ptr", "*act", ptr("k")), Param("v_ptr", "*act", ptr("v")),
        Param("M", "i32", shape("qkv", 0)), Param("T", "i32", _attr("T")),
        Param("stride_xm", "i32", stride("qkv", 0), div16=True),
        *_out_params(),
    ),
    constexpr_names=("HEAD_DIM", "BLOCK_M", "BLOCK_H"),
    precision={"input": "{act}; fp32 cos/sin", "accumulate": "fp32", "output": "{act}"},
    uses_shared_memory=False,
    space=lambda s: [({"HEAD_DIM": int(s["head_dim"]), "BLOCK_M": bm, "BLOCK_H": _block_h(int(s["head_dim"]))}, w, 1)
                     for bm in (1, 4, 16) for w in (1, 2, 4)],
    default=lambda s: ({"HEAD_DIM": int(s["head_dim"]), "BLOCK_M": 4, "BLOCK_H": _block_h(int(s["head_dim"]))}, 2, 1),
    smem_estimate=lambda c, warps, stages, nbytes: 0,
)


def _out_buffers(D: int, like: str) -> list[dict]:
    B, T, Hq, Hkv = _attr("B"), _attr("T"), _attr("n_heads"), _attr("n_kv_heads")
    return [
        {"name": "q", "shape": [B, Hq, T, D], "dtype": {"like": like}},
        {"name": "k", "shape": [B, Hkv, T, D], "dtype": {"like": like}},
        {"name": "v", "shape": [B, Hkv, T, D], "dtype": {"like": like}},
    ]


def _rope_checks(width_tensor: str, D: int) -> list[dict]:
    heads = {"add": [_attr("n_heads"), {"mul": [2, _attr("n_kv_heads")]}]}
    return [
        check("eq", shape(width_tensor, 0 if width_tensor == "wqkv" else 1), {"mul": [heads, D]},
              f"the QKV width must be (n_heads + 2 n_kv_heads) * HEAD_DIM with the compiled HEAD_DIM {D}"),
        check("eq", shape("cos", 2), D // 2, "cos/sin must have head_dim/2 columns"),
    ]


def qkv_rope_program(variants) -> dict:
    c = variants["qkv_rope_fwd"].constexprs
    D = c["HEAD_DIM"]
    heads = {"add": [_attr("n_heads"), {"mul": [2, _attr("n_kv_heads")]}]}
    buffers = _out_buffers(D, "x")
    return program_doc(
        "qkv_rope", ["x", "wqkv", "bqkv", "cos", "sin"], ["bqkv"], ["B", "T", "n_heads", "n_kv_heads"],
        checks=_rope_checks("wqkv", D),
        let=[],
        buffers=buffers,
        launches=[launch_of(QKV_ROPE_FWD, [cdiv(shape("x", 0), c["BLOCK_M"]), heads, 1])],
        outputs=["q", "k", "v"],
    )


def rope_program(variants) -> dict:
    c = variants["rope_fwd"].constexprs
    D = c["HEAD_DIM"]
    heads = {"add": [_attr("n_heads"), {"mul": [2, _attr("n_kv_heads")]}]}
    buffers = _out_buffers(D, "qkv")
    return program_doc(
        "rope", ["qkv", "cos", "sin"], [], ["B", "T", "n_heads", "n_kv_heads"],
        checks=_rope_checks("qkv", D),
        let=[],
        buffers=buffers,
        launches=[launch_of(ROPE_FWD, [cdiv(shape("qkv", 0), c["BLOCK_M"]), heads, 1])],
        outputs=["q", "k", "v"],
    )


QKV_ROPE_OP = OpKernels("qkv_rope", (QKV_ROPE_FWD,), qkv_rope_program, prepare_qkv_rope, required=(("qkv_rope_fwd",),))
ROPE_OP = OpKernels("rope", (ROPE_FWD,), rope_program, prepare_rope, required=(("rope_fwd",),))
