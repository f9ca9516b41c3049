"""Final RMSNorm -> LM head GEMV -> greedy argmax, on the device, in two launches.

Reference: ``kernels/fused_head_argmax.py``. The first kernel computes BLOCK_N
logits per program (written out in the activation dtype) and that block's
maximum and its first index; the second (one program per sequence) reduces the
per-block partials in block order, so ties go to the lowest token id as in
``torch.argmax``. Two launches instead of a grid-wide "last program reduces"
counter: the counter would need zeroing (a third launch) or device-side reset
logic, for ~1 µs saved.
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgekit.kernels.fused_gemv_triton import (
    INT4_ATTRS, INT4_INPUTS, _epilogue_apply, _epilogue_operands, _gemv_rows, _pdl_enter_gemv, format_launches,
    int4_params, operand_params, reduction_params, weight_columns_check, weight_kernels,
)
from edgekit.kernels.kernel_def import KernelDef, OpKernels, Param, launch_of, program_doc
from edgekit.kernels.launch_rule import attr, cdiv, ptr, shape, stride, sym
from edgekit.kernels.pdl_triton import _pdl_enter
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.fused_head_argmax import prepare

OP_NAME = "fused_head_argmax"
REDUCE_BLOCK = 2048


@triton.jit
def _head_logits_kernel(
    x_ptr, nw_ptr, w_ptr, s_ptr, b_ptr, logit_ptr, pv_ptr, pi_ptr, V, C, stride_xm, stride_wn, stride_lm, n_parts,
    has_bias, eps, sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, W_FORMAT: tl.constexpr, STAGES: tl.constexpr = 1,
    PDL: tl.constexpr = 0,
):
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = rows < V
    rows_ld = rows % V
    _pdl_enter_gemv(w_ptr, rows_ld, C, stride_wn, BLOCK_K, W_FORMAT, PDL)
    x_row = x_ptr + b * stride_xm
    scale, bias = _epilogue_operands(s_ptr, b_ptr, rows_ld, has_bias, W_FORMAT)
    # the norm in 1-2 wide steps (NORM_BLOCK_K 1024), not C / BLOCK_K narrow ones
    acc = _gemv_rows(x_row, nw_ptr, eps, w_ptr, rows_ld, C, stride_wn, True, W_FORMAT, BLOCK_N, BLOCK_K,
                     s_ptr, sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift,
                     NORM_BLOCK_K=1024, STAGES=STAGES)
    y = _epilogue_apply(acc, scale, bias, has_bias, W_FORMAT, logit_ptr.dtype.element_ty)  # logits as rounded
    tl.store(logit_ptr + b * stride_lm + rows, y.to(logit_ptr.dtype.element_ty), mask=mask)
    y = tl.where(mask, y, float("-inf"))
    best = tl.max(y, axis=0)
    first = tl.min(tl.where(y == best, rows, 2147483647), axis=0)
    tl.store(pv_ptr + b * n_parts + pid, best)
    tl.store(pi_ptr + b * n_parts + pid, first)


@triton.jit
def _argmax_reduce_kernel(pv_ptr, pi_ptr, tok_ptr, n_parts, BLOCK_P: tl.constexpr, PDL: tl.constexpr = 0):
    _pdl_enter(PDL)
    b = tl.program_id(0).to(tl.int64)
    p = tl.arange(0, BLOCK_P)
    best_v = tl.full((BLOCK_P,), float("-inf"), tl.float32)
    best_i = tl.full((BLOCK_P,), 2147483647, tl.int32)
    for p0 in range(0, n_parts, BLOCK_P):
        m = (p0 + p) < n_parts
        v = tl.load(pv_ptr + b * n_parts + p0 + p, mask=m, other=float("-inf"))
        i = tl.load(pi_ptr + b * n_parts + p0 + p, mask=m, other=2147483647)
        take = v > best_v  # strictly greater: an earlier block (lower ids) keeps a tie
        best_v = tl.where(take, v, best_v)
        best_i = tl.where(take, i, best_i)
    top = tl.max(best_v, axis=0)
    tl.store(tok_ptr + b, tl.min(tl.where(best_v == top, best_i, 2147483647), axis=0).to(tl.int64))


def _params(w_type: str, scale_value) -> tuple[Param, ...]:
    return (
        *operand_params(w_type, scale_value, norm=True, bias=True),
        Param("logit_ptr", "*act", ptr("logits")),
        Param("pv_ptr", "*fp32", ptr("part_max")),
        Param("pi_ptr", "*i32", ptr("part_idx")),
        Param("V", "i32", shape("weight", 0)),
        *reduction_params("C"),
        Param("stride_lm", "i32", stride("logits", 0)),
        Param("n_parts", "i32", sym("PARTS")),
        Param("has_bias", "i32", {"present": "bias"}),
        Param("eps", "fp32", attr("eps")),
        *int4_params(),
    )


def _space(s: dict) -> list:
    return [({"BLOCK_N": bn, "BLOCK_K": bk}, w, 1) for bn in (16, 32, 64) for bk in (256, 512, 1024, 2048) for w in (4, 8, 16)]


def _default(s: dict):
    # The LM head is the one GEMV whose grid is always thousands of programs (V / BLOCK_N), so occupancy hides the
    # per-step latency: the per-operator GEMV's tile (32 x 256 at 4 warps, 94% of copy bandwidth on 117 MB in
    # tools/gemv_lab.py). The whole-K tile of the other fused GEMVs (16 x 2048 at 16 warps, one block an SM)
    # read the 1B head at ~60% of copy bandwidth (209 us for 525 MB, H200). 32 rows also keep the partials few.
    return {"BLOCK_N": 32, "BLOCK_K": 256}, 4, 1


HEAD_W4_BLOCK_K, HEAD_W4_WARPS, HEAD_W4_STAGES = 256, 2, 4


def _default_w4(s: dict):
    # INT4 weights at the float kernel's 32 rows, which every head kernel shares (one partials layout): a short K
    # step (128 weights a thread at 2 warps) whose next 3 steps' loads are staged through shared memory (16 KB), at
    # most one stage a step. Swept on an H100 (2026-12-06, tools/fused_tile_sweep.py --ops fused_head_argmax
    # --precisions int4, llama-3.2-1b's 128256 x 2048 head, 36 candidates): 57.7 us, 80% of copy bandwidth, where
    # the INT4 GEMVs' rule (int4_gemv_tile: 32 x 1024 at 4 warps, unstaged) took 79.5 us (58%); 512 x 3 stages and 4
    # warps within 1%, every unstaged tile >= 60.8 us.
    k = int(s.get("k_in") or 2048)
    return {"BLOCK_N": 32, "BLOCK_K": HEAD_W4_BLOCK_K}, HEAD_W4_WARPS, max(1, min(HEAD_W4_STAGES, k // HEAD_W4_BLOCK_K))


# float, INT8 and INT4 weights (fused_head_argmax.FUSION's schemes: the fused path takes each)
FP, W8, W4 = weight_kernels(OP_NAME, "head_logits", _head_logits_kernel, _params, ("BLOCK_N", "BLOCK_K"),
                            _space, _default, default_w4=_default_w4)

REDUCE = KernelDef(
    op=OP_NAME, kernel="head_argmax_reduce", fn=_argmax_reduce_kernel,
    params=(Param("pv_ptr", "*fp32", ptr("part_max")), Param("pi_ptr", "*i32", ptr("part_idx")),
            Param("tok_ptr", "*i64", ptr("token")), Param("n_parts", "i32", sym("PARTS"))),
    constexpr_names=("BLOCK_P",), precision={"input": "fp32", "accumulate": "fp32", "output": "int64"},
    uses_shared_memory=False, space=lambda s: [({"BLOCK_P": REDUCE_BLOCK}, 8, 1)],
    default=lambda s: ({"BLOCK_P": REDUCE_BLOCK}, 8, 1), smem_estimate=lambda c, warps, stages, nbytes: 8 * 32 * warps,
    pdl=True,
)


def program(variants) -> dict:
    head = next(v for k, v in variants.items() if k != REDUCE.kernel)
    block_n = head.constexprs["BLOCK_N"]
    if any(v.constexprs["BLOCK_N"] != block_n for k, v in variants.items() if k != REDUCE.kernel):
        from edgekit.errors import OperatorError

        raise OperatorError(f"{OP_NAME}: the float, INT8 and INT4 head kernels must share BLOCK_N (one partials "
                            f"layout)")
    launches, checks = format_launches(OP_NAME, (FP, W8, W4), variants,
                                          lambda v: [sym("PARTS"), shape("x", 0), 1])
    launches.append(launch_of(REDUCE, [shape("x", 0), 1, 1]))
    return program_doc(
        OP_NAME, ["x", "norm_weight", "weight", "scale", *INT4_INPUTS, "bias"], ["scale", *INT4_INPUTS, "bias"],
        ["eps", *INT4_ATTRS],
        checks=checks + [weight_columns_check(shape("x", 1), "weight columns must equal x's width")],
        let=[["PARTS", cdiv(shape("weight", 0), block_n)]],
        buffers=[{"name": "logits", "shape": [shape("x", 0), shape("weight", 0)], "dtype": {"like": "x"}},
                 {"name": "part_max", "shape": [shape("x", 0), sym("PARTS")], "dtype": "fp32"},
                 {"name": "part_idx", "shape": [shape("x", 0), sym("PARTS")], "dtype": "i32"},
                 {"name": "token", "shape": [shape("x", 0)], "dtype": "i64"}],
        launches=launches,
        outputs=["token", "logits"],
    )


OP = OpKernels(op=OP_NAME, kernels=(FP, W8, W4, REDUCE), program=program, prepare=prepare,
               required=((FP.kernel, W8.kernel, W4.kernel), (REDUCE.kernel,)))
