"""QK-norm + RoPE as one Triton kernel: each program normalizes and rotates one head of BLOCK_M tokens.

Reference: ``kernels/qk_norm_rope.py``. A program reads the two halves of one
head for its rows (so it sees the whole head: the RMS is over head_dim), scales
Q and K heads by their rsqrt(mean square + eps) and norm weight in FP32,
rounds to the activation dtype (as the reference's rmsnorm does), then rotates
and writes straight into the (B, H, T, D) outputs with RoPE's store
(``rope_triton._rotate_store``); V heads are copied. Memory-bound; no shared
memory.
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgekit.kernels.kernel_def import KernelDef, OpKernels, Param, launch_of, program_doc
from edgekit.kernels.launch_rule import attr, cdiv, ptr, shape, stride
from edgekit.kernels.rope_triton import _block_h, _out_buffers, _out_params, _rope_checks, _rotate_store
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.qk_norm_rope import prepare


@triton.jit
def _qk_norm_rope_kernel(
    qkv_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr,
    M, T, stride_xm, stride_cb, stride_ct, stride_sb, stride_st,
    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
    Hq, Hkv, eps,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr,
):
    HALF: tl.constexpr = HEAD_DIM // 2
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    head = tl.program_id(1)
    rm_ld = rm % M
    rh = tl.arange(0, BLOCK_H)
    h_mask = rh < HALF
    smask = (rm < M)[:, None] & h_mask[None, :]
    src = qkv_ptr + rm_ld[:, None] * stride_xm + head * HEAD_DIM + rh[None, :]
    a1 = tl.load(src, mask=smask, other=0.0).to(tl.float32)  # (BM, BH): the head's first half
    a2 = tl.load(src + HALF, mask=smask, other=0.0).to(tl.float32)
    if head < Hq + Hkv:  # a Q or K head: RMS over the whole head, then its norm weight
        if head < Hq:
            w1 = tl.load(qn_ptr + rh, mask=h_mask, other=0.0).to(tl.float32)
            w2 = tl.load(qn_ptr + HALF + rh, mask=h_mask, other=0.0).to(tl.float32)
        else:
            w1 = tl.load(kn_ptr + rh, mask=h_mask, other=0.0).to(tl.float32)
            w2 = tl.load(kn_ptr + HALF + rh, mask=h_mask, other=0.0).to(tl.float32)
        inv = 1.0 / tl.sqrt((tl.sum(a1 * a1, 1) + tl.sum(a2 * a2, 1)) / HEAD_DIM + eps)  # (BM,)
        a1 = (a1 * inv[:, None] * w1[None, :]).to(q_ptr.dtype.element_ty).to(tl.float32)  # rounded like rmsnorm's
        a2 = (a2 * inv[:, None] * w2[None, :]).to(q_ptr.dtype.element_ty).to(tl.float32)
    _rotate_store(a1, a2, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, rm_ld // T, rm_ld % T, head, rh, smask,
                  stride_cb, stride_ct, stride_sb, stride_st,
                  stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
                  Hq, Hkv, HALF)


def _space(s: dict) -> list:
    d = int(s["head_dim"])
    return [({"HEAD_DIM": d, "BLOCK_M": bm, "BLOCK_H": _block_h(d)}, w, 1) for bm in (1, 4, 16) for w in (1, 2, 4)]


QK_NORM_ROPE_FWD = KernelDef(
    op="qk_norm_rope",
    kernel="qk_norm_rope_fwd",
    fn=_qk_norm_rope_kernel,
    params=(
        Param("qkv_ptr", "*act", ptr("qkv")),
        Param("qn_ptr", "*act", ptr("q_norm")), Param("kn_ptr", "*act", ptr("k_norm")),
        Param("cos_ptr", "*fp32", ptr("cos")), Param("sin_ptr", "*fp32", ptr("sin")),
        Param("q_ptr", "*act", ptr("q")), Param("k_ptr", "*act", ptr("k")), Param("v_ptr", "*act", ptr("v")),
        Param("M", "i32", shape("qkv", 0)), Param("T", "i32", attr("T")),
        Param("stride_xm", "i32", stride("qkv", 0), div16=True),
        *_out_params(),
        Param("eps", "fp32", attr("eps")),
    ),
    constexpr_names=("HEAD_DIM", "BLOCK_M", "BLOCK_H"),
    precision={"input": "{act}; fp32 cos/sin", "accumulate": "fp32 (normed heads rounded to {act} before rotating)",
               "output": "{act}"},
    uses_shared_memory=False,
    space=_space,
    default=lambda s: ({"HEAD_DIM": int(s["head_dim"]), "BLOCK_M": 4, "BLOCK_H": _block_h(int(s["head_dim"]))}, 2, 1),
    smem_estimate=lambda c, warps, stages, nbytes: 0,
)


def program(variants) -> dict:
    c = variants["qk_norm_rope_fwd"].constexprs
    D = c["HEAD_DIM"]
    heads = {"add": [attr("n_heads"), {"mul": [2, attr("n_kv_heads")]}]}
    return program_doc(
        "qk_norm_rope", ["qkv", "q_norm", "k_norm", "cos", "sin"], [], ["B", "T", "n_heads", "n_kv_heads", "eps"],
        checks=_rope_checks("qkv", D),
        let=[],
        buffers=_out_buffers(D, "qkv"),
        launches=[launch_of(QK_NORM_ROPE_FWD, [cdiv(shape("qkv", 0), c["BLOCK_M"]), heads, 1])],
        outputs=["q", "k", "v"],
    )


OP = OpKernels("qk_norm_rope", (QK_NORM_ROPE_FWD,), program, prepare, required=(("qk_norm_rope_fwd",),))
