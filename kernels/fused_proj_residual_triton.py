"""Projection + residual add as one Triton GEMV (the attention output projection and the MLP down projection).

Reference: ``kernels/fused_proj_residual.py``. One program owns BLOCK_N output
rows of one sequence; the projection is rounded to the activation dtype before
the add, as the per-operator path. Grid: (cdiv(N, BLOCK_N), B).
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgekit.kernels.fused_gemv_triton import (
    INT4_ATTRS, INT4_INPUTS, _epilogue_apply, _epilogue_operands, _gemv_rows, _pdl_enter_gemv, format_launches,
    gemv_tile, int4_params, measured_from_k, operand_params, reduction_params, weight_columns_check, weight_kernels,
)
from edgekit.kernels.kernel_def import OpKernels, Param, program_doc
from edgekit.kernels.launch_rule import cdiv, check, ptr, shape, stride
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.fused_proj_residual import prepare

OP_NAME = "fused_proj_residual"


@triton.jit
def _proj_residual_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, r_ptr, y_ptr, N, K, stride_xm, stride_wn, stride_rm, stride_ym, has_bias,
    sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, W_FORMAT: tl.constexpr, STAGES: tl.constexpr = 1,
    PDL: tl.constexpr = 0,
):
    _pdl_enter_gemv(w_ptr, (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)) % N, K, stride_wn, BLOCK_K, W_FORMAT, PDL)
    _proj_residual_program(
        tl.program_id(0), tl.program_id(1).to(tl.int64), x_ptr, w_ptr, s_ptr, b_ptr, r_ptr, y_ptr, N, K, stride_xm, stride_wn,
        stride_rm, stride_ym, has_bias, BLOCK_N, BLOCK_K, W_FORMAT,
        sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift, STAGES)


@triton.jit
def _proj_residual_program(
    pid, b,
    x_ptr, w_ptr, s_ptr, b_ptr, r_ptr, y_ptr, N, K, stride_xm, stride_wn, stride_rm, stride_ym, has_bias,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, W_FORMAT: tl.constexpr,
    sh_ptr=0, oh_ptr=0, of_ptr=0, stride_sn=0, has_offset=0, scale_f32=0, group_shift=0, STAGES: tl.constexpr = 1,
):
    """Program for BLOCK_N output rows of sequence ``b`` (float and INT8 weights leave the INT4 operands after
    W_FORMAT at their defaults)."""
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = rows < N
    rows_ld = rows % N  # rows past N read valid memory; never stored
    # the epilogue's operands and the residual first: their loads overlap the weight stream
    scale, bias = _epilogue_operands(s_ptr, b_ptr, rows_ld, has_bias, W_FORMAT)
    res = tl.load(r_ptr + b * stride_rm + rows, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    acc = _gemv_rows(x_ptr + b * stride_xm, x_ptr, 1.0, w_ptr, rows_ld, K, stride_wn, False, W_FORMAT, BLOCK_N, BLOCK_K,
                     s_ptr, sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift, STAGES=STAGES)
    y = _epilogue_apply(acc, scale, bias, has_bias, W_FORMAT, y_ptr.dtype.element_ty)
    tl.store(y_ptr + b * stride_ym + rows, (res + y).to(y_ptr.dtype.element_ty), mask=mask)


def _params(w_type: str, scale_value) -> tuple[Param, ...]:
    return (
        *operand_params(w_type, scale_value, norm=False, bias=True),
        Param("r_ptr", "*act", ptr("residual")),
        Param("y_ptr", "*act", ptr("y")),
        Param("N", "i32", shape("weight", 0)),
        *reduction_params("K"),
        Param("stride_rm", "i32", stride("residual", 0), div16=True),
        Param("stride_ym", "i32", stride("y", 0), div16=True),
        Param("has_bias", "i32", {"present": "bias"}),
        *int4_params(),
    )


def _space(s: dict) -> list:
    return [({"BLOCK_N": bn, "BLOCK_K": bk}, w, 1) for bn in (2, 4, 8, 16) for bk in (256, 512, 1024, 2048) for w in (4, 8)]


def _default(s: dict, int4: bool = False):
    rows, block_k, warps = gemv_tile(s, int4=int4)
    return {"BLOCK_N": rows, "BLOCK_K": block_k}, warps, 1


# Long reductions (the down projection, K >= 4096): the K loop's loads staged through shared memory (STAGES) over
# shorter steps. H200, 2026-12-02, llama-3.2-1b 2048 x 8192 (tools/fused_tile_sweep.py): FP16 4 x 512 at 4 warps,
# 5 stages 10.36 us against 10.79 for 4 x 2048 unstaged; INT8 4 x 1024 at 2 warps, 4 stages 7.13 against 7.73.
# (INT4's 4 x 4096 unstaged stayed fastest, 6.70 against 7.21 staged.) Shorter K: the unstaged tiles were as fast.
# Without a K fact, unstaged: the operator serves the short o-projection as well.
LONG_K = 4096
_default_fp = measured_from_k(LONG_K, ({"BLOCK_N": 4, "BLOCK_K": 512}, 4, 5), _default, k_unknown=0)
_default_w8 = measured_from_k(LONG_K, ({"BLOCK_N": 4, "BLOCK_K": 1024}, 2, 4), _default, k_unknown=0)


FP, W8, W4 = weight_kernels(OP_NAME, "proj_residual", _proj_residual_kernel, _params, ("BLOCK_N", "BLOCK_K"),
                            _space, _default_fp, default_w8=_default_w8, default_w4=lambda s: _default(s, int4=True))


def program(variants) -> dict:
    launches, checks = format_launches(OP_NAME, (FP, W8, W4), variants,
                                          lambda v: [cdiv(shape("weight", 0), v.constexprs["BLOCK_N"]), shape("x", 0), 1])
    return program_doc(
        OP_NAME, ["x", "weight", "scale", *INT4_INPUTS, "bias", "residual"], ["scale", *INT4_INPUTS, "bias"], INT4_ATTRS,
        checks=checks + [weight_columns_check(shape("x", 1), "weight columns must equal x's width"),
                         check("eq", shape("residual", 1), shape("weight", 0), "residual width must equal weight rows")],
        let=[],
        buffers=[{"name": "y", "shape": [shape("x", 0), shape("weight", 0)], "dtype": {"like": "x"}}],
        launches=launches,
        outputs=["y"],
    )


OP = OpKernels(op=OP_NAME, kernels=(FP, W8, W4), program=program, prepare=prepare,
               required=((FP.kernel, W8.kernel, W4.kernel),))
