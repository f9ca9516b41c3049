"""RMSNorm -> QKV GEMV (+bias) -> per-head RMSNorm of Q and K -> RoPE -> KV-cache write, as one Triton kernel.

Reference: ``kernels/fused_norm_qkv_qknorm_rope.py``. The GEMV is
``fused_norm_qkv_rope``'s: a program owns PAIRS rotation pairs of one head (weight
rows j and j + D/2, interleaved: ``_qkv_rows``), so the grid covers the SMs as
that kernel's does. A head's RMSNorm needs all D of its outputs, which several
programs make, so the norm and the rotation wait for the last of them:

- a V head's program writes its rows straight into the cache at the slot (no norm, no rotation);
- a Q or K head's program writes its rows (rounded to the activation dtype, as the projection's output) into a
  workspace and counts itself in at its KV head's group counter (``arrivals``: the G query heads of the KV head
  and its key head, (G + 1) * D / (2 PAIRS) programs); the last to arrive reads the group's G + 1 heads back
  (through L2) in one (HEADS_P, D/2) tile per half, normalises each head (FP32, its weight, the result rounded to
  the activation dtype as a norm writes it), rotates them by the position's cos / sin and writes Q to ``q`` and K
  into the cache at the slot, then puts the counter back to zero.

Why not a whole head a program (the simpler kernel): the grid would be Hq + 2 Hkv programs a sequence, 6 at
gemma-3-1b (4 query heads, 1 KV head, head_dim 256: 1.5M weights through 6 SMs), 32 at qwen3-0.6b, where the
pair-tiled GEMV has hundreds. The counter is the pattern of ``fused_attn_proj_residual``'s split-KV merge, on the
same per-layer counters (zero before the call, left at zero): they are free when this kernel runs and the
attention after it finds them as it expects. Grid: ((Hq + 2 Hkv) * D / (2 PAIRS), B).
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgekit.kernels.fused_gemv_triton import (
    INT4_ATTRS, INT4_INPUTS, _epilogue_apply, _epilogue_operands, _gemv_rows, _pdl_enter_gemv, _rstd,
    format_launches, weight_kernels,
)
from edgekit.kernels.fused_norm_qkv_rope_triton import _default as _pairs_default
from edgekit.kernels.fused_norm_qkv_rope_triton import _qkv_rows, qkv_params
from edgekit.kernels.fused_norm_qkv_rope_triton import _space as _pairs_space
from edgekit.kernels.kernel_def import OpKernels, Param, pow2_at_least, program_doc
from edgekit.kernels.launch_rule import attr, check, mul, shape
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.fused_norm_qkv_qknorm_rope import prepare

OP_NAME = "fused_norm_qkv_qknorm_rope"


@triton.jit
def _norm_qkv_qknorm_rope_kernel(
    x_ptr, nw_ptr, w_ptr, s_ptr, b_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, kc_ptr, vc_ptr, arr_ptr,
    ws_ptr, q_ptr,
    C, stride_xm, stride_wn, stride_cs, stride_kb, stride_kh, stride_ks, stride_qb, has_bias, eps, qk_eps, n_heads,
    n_kv_heads,
    sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift,
    HALF: tl.constexpr, PAIRS: tl.constexpr, BLOCK_K: tl.constexpr, HEADS_P: tl.constexpr, W_FORMAT: tl.constexpr,
    STAGES: tl.constexpr = 1, PDL: tl.constexpr = 0,
):
    _pdl_enter_gemv(w_ptr, _qkv_rows(tl.program_id(0), HALF, PAIRS), C, stride_wn, BLOCK_K, W_FORMAT, PDL)
    pid, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    head = pid // (HALF // PAIRS)
    j = (pid % (HALF // PAIRS)) * PAIRS + tl.arange(0, PAIRS)
    rows = _qkv_rows(pid, HALF, PAIRS)
    scale, bias = _epilogue_operands(s_ptr, b_ptr, rows, has_bias, W_FORMAT)  # loaded while the weights stream
    slot = tl.load(slot_ptr + b)
    acc = _gemv_rows(x_ptr + b * stride_xm, nw_ptr, eps, w_ptr, rows, C, stride_wn, True, W_FORMAT, 2 * PAIRS, BLOCK_K,
                     s_ptr, sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift, STAGES=STAGES,
                     NORM_FACTORED=1)  # the norm's scale after the sum: _norm_gemv_rows_float says why
    y = _epilogue_apply(acc, scale, bias, has_bias, W_FORMAT, x_ptr.dtype.element_ty)  # (2 PAIRS,) qkv as rounded
    x1, x2 = tl.split(tl.reshape(y, (PAIRS, 2)))  # first and second half of each pair
    n_qk = n_heads + n_kv_heads
    if head >= n_qk:  # a V head: into the cache as projected
        dst = vc_ptr + b * stride_kb + (head - n_qk) * stride_kh + slot * stride_ks + j
        tl.store(dst, x1.to(vc_ptr.dtype.element_ty))
        tl.store(dst + HALF, x2.to(vc_ptr.dtype.element_ty))
    else:
        # the tail's operands (the position's cos / sin rows, both norm weights), requested before the workspace
        # stores and the release below so that their dependent chain (the position, then its rows) overlaps the
        # fence and the atomic instead of following them on the group's last program, the kernel's critical path.
        # Not before the GEMV: held across the weight stream they cost more than they saved (H200, qwen3-1.7b
        # fp16, CUDA-graph replay: 10.25 us against 9.57; gemma-3-1b 6.67 against 7.79)
        d = tl.arange(0, HALF)
        pos = tl.load(pos_ptr + b)
        cos_row = tl.load(cos_ptr + pos * stride_cs + d)
        sin_row = tl.load(sin_ptr + pos * stride_cs + d)
        qw1, qw2 = tl.load(qn_ptr + d).to(tl.float32), tl.load(qn_ptr + HALF + d).to(tl.float32)
        kw1, kw2 = tl.load(kn_ptr + d).to(tl.float32), tl.load(kn_ptr + HALF + d).to(tl.float32)
        ws_row = ws_ptr + (b * n_qk + head) * (2 * HALF)
        tl.store(ws_row + j, x1.to(ws_ptr.dtype.element_ty))
        tl.store(ws_row + HALF + j, x2.to(ws_ptr.dtype.element_ty))
        group = n_heads // n_kv_heads
        kv = tl.where(head < n_heads, head // group, head - n_heads)
        counter = arr_ptr + b * n_kv_heads + kv
        tl.debug_barrier()  # every thread's workspace stores come before the release below
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == (group + 1) * (HALF // PAIRS) - 1:
            tl.debug_barrier()  # the acquire above comes before every thread's workspace loads
            _qk_norm_rope_group(ws_ptr, qw1, qw2, kw1, kw2, cos_row, sin_row, q_ptr, kc_ptr, b, kv, slot, group,
                                n_heads, n_qk, qk_eps, stride_kb, stride_kh, stride_ks, stride_qb, HALF, HEADS_P)
            tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")  # the whole group has arrived: left at zero


@triton.jit
def _qk_norm_rope_group(ws_ptr, qw1, qw2, kw1, kw2, cos_row, sin_row, q_ptr, kc_ptr, b, kv, slot, group, n_heads, n_qk,
                        qk_eps, stride_kb, stride_kh, stride_ks, stride_qb, HALF: tl.constexpr, HEADS_P: tl.constexpr):
    """The G query heads of KV head ``kv`` and its key head, from the workspace: per-head RMSNorm (FP32 norm weights
    ``qw1``/``qw2``, ``kw1``/``kw2``: each head's first and second half), RoPE by the position's ``cos_row`` /
    ``sin_row`` (HALF,), stores."""
    d = tl.arange(0, HALF)
    i = tl.arange(0, HEADS_P)  # 0..G-1: the query heads, G: the key head
    live = i <= group
    is_q = i < group
    head = tl.where(is_q, kv * group + i, n_heads + kv)
    src = ws_ptr + (b * n_qk + head)[:, None] * (2 * HALF) + d[None, :]
    x1 = tl.load(src, mask=live[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)  # (HEADS_P, HALF)
    x2 = tl.load(src + HALF, mask=live[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
    ss = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)
    rstd = _rstd(ss, 2 * HALF, qk_eps)[:, None]
    w1 = tl.where(is_q[:, None], qw1[None, :], kw1[None, :])
    w2 = tl.where(is_q[:, None], qw2[None, :], kw2[None, :])
    DTYPE: tl.constexpr = q_ptr.dtype.element_ty
    n1 = (x1 * rstd * w1).to(DTYPE).to(tl.float32)  # the norm's output, rounded as a norm writes it
    n2 = (x2 * rstd * w2).to(DTYPE).to(tl.float32)
    c = cos_row[None, :]
    s = sin_row[None, :]
    o1 = (n1 * c - n2 * s).to(DTYPE)
    o2 = (n2 * c + n1 * s).to(DTYPE)
    q_dst = q_ptr + b * stride_qb + head[:, None] * (2 * HALF) + d[None, :]
    q_mask = is_q[:, None]
    tl.store(q_dst, o1, mask=q_mask)
    tl.store(q_dst + HALF, o2, mask=q_mask)
    k_dst = kc_ptr + b * stride_kb + kv * stride_kh + slot * stride_ks + (d[None, :] + 0 * i[:, None])
    k_mask = (i == group)[:, None]
    tl.store(k_dst, o1, mask=k_mask)
    tl.store(k_dst + HALF, o2, mask=k_mask)


def _params(w_type: str, scale_value) -> tuple[Param, ...]:
    return qkv_params(w_type, scale_value, qk_norm=True)


def _heads_p(s: dict) -> int:
    """The group tile: the query heads of a KV head and its key head, rounded up to a power of two."""
    return pow2_at_least(max(1, int(s.get("n_heads") or 1) // max(1, int(s.get("n_kv_heads") or 1))) + 1, 2)


def _space(s: dict) -> list:
    return [({**c, "HEADS_P": _heads_p(s)}, w, n) for c, w, n in _pairs_space(s)]


def _default(s: dict, int4: bool = False):
    c, w, n = _pairs_default(s, int4=int4)
    return {**c, "HEADS_P": _heads_p(s)}, w, n


# The float kernel's K loop staged through shared memory (4 stages of 256-wide steps, 8 pairs a program: 27 KB) from
# Gemma 3 1B's width up. Measured in the graphed decode step against the unstaged 2 pairs x 2048 (H100 80GB HBM3,
# tools/step_ab.py, depth 512, interleaved runs, greedy tokens equal, 2026-12-06): qwen3-1.7b fp16 627.4 -> 631.7
# tok/s (+0.7%; again on another tree 627.6 -> 631.8), gemma-3-1b (C 1152) 746.1 -> 752.8 (+0.9%), qwen3-4b 296.9
# -> 299.6 (+0.9%); qwen3-0.6b (C 1024) 1135.7 -> 1134.6, so not below 1152. On the H200 (step_ab, 5 interleaved runs,
# tokens equal, 2026-12-06): qwen3-1.7b 767.6 -> 778.4 (+1.4%), gemma-3-1b 823.8 -> 827.2 (+0.4%); its FP64 GPU tests
# (tests/kernels/test_fused_gpu.py -k qknorm) pass there at this tile. Why staging pays for this GEMV and not for
# the other fused ones at these widths was not profiled. It was first taken only on sm_90+ GPUs, where it was
# measured. The Orin-shaped run then measured it there too: gemma-3-1b fp16 confined to 16 SMs of an H100 (green
# context, tools/step_ab.py --sms 16 --context 512, 3 interleaved runs, tokens equal, 2026-12-07), the unstaged tile
# in place of this one cost 4.0% of the step (264.8 -> 254.3 tok/s). So planned variants (an orin bundle, which fits
# its 27 KB in any target's budget) and GPUs of every arch take it as well. The INT8 and INT4 kernels keep their
# unstaged defaults.
STAGED_FROM_K = 1152


def _default_fp(s: dict):
    c, w, n = _default(s)
    if int(s.get("k_in") or 0) >= STAGED_FROM_K and c["HALF"] % 8 == 0:
        return {**c, "PAIRS": 8, "BLOCK_K": 256}, 4, 4
    return c, w, n


FP, W8, W4 = weight_kernels(OP_NAME, "norm_qkv_qknorm_rope", _norm_qkv_qknorm_rope_kernel, _params,
                            ("HALF", "PAIRS", "BLOCK_K", "HEADS_P"), _space, _default_fp,
                            default_w8=_default,
                            default_w4=lambda s: _default(s, int4=True),
                            rows_a_step=lambda c: 2 * c["PAIRS"])  # both halves of each rotation pair


def program(variants) -> dict:
    n_q, n_kv = attr("n_heads"), attr("n_kv_heads")
    heads = {"add": [n_q, mul(2, n_kv)]}

    def grid(v):
        return [mul(heads, v.constexprs["HALF"] // v.constexprs["PAIRS"]), shape("x", 0), 1]

    launches, checks = format_launches(OP_NAME, (FP, W8, W4), variants, grid)
    cs = next(iter(variants.values())).constexprs
    half, heads_p = cs["HALF"], cs["HEADS_P"]
    B = shape("x", 0)
    return program_doc(
        OP_NAME, ["x", "norm_weight", "weight", "scale", *INT4_INPUTS, "bias", "q_norm", "k_norm", "cos", "sin",
                  "positions", "slots", "k_cache", "v_cache", "arrivals"],
        ["scale", *INT4_INPUTS, "bias"], ["eps", "qk_eps", "n_heads", "n_kv_heads", *INT4_ATTRS],
        checks=checks + [
            check("eq", shape("cos", 1), half, "the kernel was compiled for another head_dim (cos is (S, D/2))"),
            check("eq", shape("weight", 0), mul(heads, 2 * half),
                  "weight rows must be (n_heads + 2 n_kv_heads) * head_dim"),
            check("eq", shape("k_cache", 3), 2 * half, "the cache's head_dim must match the compiled one"),
            check("eq", shape("q_norm", 0), 2 * half, "q_norm must hold one weight per head_dim element"),
            check("eq", shape("k_norm", 0), 2 * half, "k_norm must hold one weight per head_dim element"),
            check("multiple_of", n_q, n_kv, "n_heads must be a multiple of n_kv_heads"),
            check("le", {"add": [{"floordiv": [n_q, n_kv]}, 1]}, heads_p,
                  f"query heads per KV head plus the key head must fit the compiled HEADS_P {heads_p}"),
            check("eq", shape("arrivals", 0), B, "arrivals must hold one counter per (sequence, KV head)"),
            check("eq", shape("arrivals", 1), n_kv, "arrivals must hold one counter per (sequence, KV head)"),
        ],
        let=[],
        buffers=[{"name": "q", "shape": [B, n_q, 2 * half], "dtype": {"like": "x"}},
                 {"name": "qk_rows", "shape": [B, {"add": [n_q, n_kv]}, 2 * half], "dtype": {"like": "x"}}],
        launches=launches,
        outputs=["q"],
    )


OP = OpKernels(op=OP_NAME, kernels=(FP, W8, W4), program=program, prepare=prepare,
               required=((FP.kernel, W8.kernel, W4.kernel),))
