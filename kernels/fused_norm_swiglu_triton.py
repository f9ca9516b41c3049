"""RMSNorm -> gate/up GEMV -> SwiGLU as one Triton kernel.

Reference: ``kernels/fused_norm_swiglu.py``. A program owns BLOCK_N columns of
the MLP's hidden layer: gate row n and up row F + n, loaded interleaved so one
pass over K yields both factors. Gate and up are rounded to the activation
dtype before SwiGLU, as the per-operator path. Grid: (cdiv(F, BLOCK_N), B).
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgekit.kernels.fused_gemv_triton import (
    INT4_ATTRS, INT4_INPUTS, _epilogue_apply, _epilogue_operands, _gemv_rows, _pdl_enter_gemv, format_launches,
    gemv_tile, int4_params, measured_from_k, operand_params, reduction_params, weight_columns_check, weight_kernels,
)
from edgekit.kernels.kernel_def import OpKernels, Param, program_doc
from edgekit.kernels.launch_rule import attr, cdiv, check, ptr, shape, stride
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.fused_norm_swiglu import prepare

OP_NAME = "fused_norm_swiglu"


@triton.jit
def _norm_swiglu_kernel(
    x_ptr, nw_ptr, w_ptr, s_ptr, y_ptr, F, C, stride_xm, stride_wn, stride_ym, eps,
    sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, W_FORMAT: tl.constexpr, STAGES: tl.constexpr = 1,
    PDL: tl.constexpr = 0,
):
    _pdl_enter_gemv(w_ptr, _gate_up_rows(tl.program_id(0), F, BLOCK_N), C, stride_wn, BLOCK_K, W_FORMAT, PDL)
    _norm_swiglu_program(
        tl.program_id(0), tl.program_id(1).to(tl.int64), x_ptr, nw_ptr, w_ptr, s_ptr, y_ptr, F, C, stride_xm, stride_wn,
        stride_ym, eps, BLOCK_N, BLOCK_K, W_FORMAT, sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32,
        group_shift, STAGES)


@triton.jit
def _gate_up_rows(pid, F, BLOCK_N: tl.constexpr):
    """The weight rows of program ``pid``, interleaved: gate row n, up row F + n for its BLOCK_N columns n."""
    r = tl.arange(0, 2 * BLOCK_N)
    return (pid * BLOCK_N + r // 2) % F + (r % 2) * F


@triton.jit
def _norm_swiglu_program(
    pid, b,
    x_ptr, nw_ptr, w_ptr, s_ptr, y_ptr, F, C, stride_xm, stride_wn, stride_ym, eps,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, W_FORMAT: tl.constexpr,
    sh_ptr=0, oh_ptr=0, of_ptr=0, stride_sn=0, has_offset=0, scale_f32=0, group_shift=0, STAGES: tl.constexpr = 1,
):
    """Program for BLOCK_N hidden columns of sequence ``b`` (float and INT8 weights leave the INT4 operands after
    W_FORMAT at their defaults)."""
    n0 = pid * BLOCK_N
    rows = _gate_up_rows(pid, F, BLOCK_N)
    x_row = x_ptr + b * stride_xm
    scale, no_bias = _epilogue_operands(s_ptr, s_ptr, rows, 0, W_FORMAT)  # loaded while the weights stream
    acc = _gemv_rows(x_row, nw_ptr, eps, w_ptr, rows, C, stride_wn, True, W_FORMAT, 2 * BLOCK_N, BLOCK_K,
                     s_ptr, sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift, STAGES=STAGES)
    gu = _epilogue_apply(acc, scale, no_bias, 0, W_FORMAT, y_ptr.dtype.element_ty)
    g, u = tl.split(tl.reshape(gu, (BLOCK_N, 2)))
    cols = n0 + tl.arange(0, BLOCK_N)
    tl.store(y_ptr + b * stride_ym + cols, (g * tl.sigmoid(g) * u).to(y_ptr.dtype.element_ty), mask=cols < F)


def _params(w_type: str, scale_value) -> tuple[Param, ...]:
    return (
        *operand_params(w_type, scale_value, norm=True, bias=False),
        Param("y_ptr", "*act", ptr("y")),
        Param("F", "i32", shape("y", 1)),
        *reduction_params("C"),
        Param("stride_ym", "i32", stride("y", 0), div16=True),
        Param("eps", "fp32", attr("eps")),
        *int4_params(),
    )


def _space(s: dict) -> list:
    return [({"BLOCK_N": bn, "BLOCK_K": bk}, w, 1) for bn in (2, 4, 8, 16) for bk in (256, 512, 1024, 2048) for w in (4, 8)]


def _default(s: dict, int4: bool = False):
    rows, block_k, warps = gemv_tile(s, int4=int4)  # rows counts gate and up rows: BLOCK_N columns of the hidden layer each
    return {"BLOCK_N": rows // 2, "BLOCK_K": block_k}, warps, 1


# INT8 gate/up at K >= 2048 (tile sweep, H200, llama-3.2-1b 16384 x 2048, tools/fused_tile_sweep.py): 8 columns
# (16 rows) x 512 at 4 warps read at 67% of copy bandwidth (11.95 us) against 46% (17.46 us) for the float
# kernel's 2 x 2048: INT8 rows are half the bytes, so a K step needs more rows to keep as many bytes in flight.
_default_w8 = measured_from_k(2048, ({"BLOCK_N": 8, "BLOCK_K": 512}, 4, 1), _default)
# INT4 gate/up at K >= 2048 (H200, 2026-12-02, llama-3.2-1b 16384 x 2048, tools/fused_tile_sweep.py): 8 columns
# (16 rows) x 512 at 2 warps, the K loop's loads staged two deep through shared memory (STAGES 2), 9.84 us against
# 11.48 for int4_gemv_tile's 32 x 1024 unstaged: a short step holds 64 weights a thread instead of 128 (fewer
# registers, more programs resident) while the next step's bytes are already in flight.
_default_w4 = measured_from_k(2048, ({"BLOCK_N": 8, "BLOCK_K": 512}, 2, 2), lambda s: _default(s, int4=True))


FP, W8, W4 = weight_kernels(OP_NAME, "norm_swiglu", _norm_swiglu_kernel, _params, ("BLOCK_N", "BLOCK_K"),
                            _space, _default, default_w8=_default_w8, default_w4=_default_w4,
                            rows_a_step=lambda c: 2 * c["BLOCK_N"])  # gate and up rows


def gate_up_program(op: str, kernels: tuple):
    """The launch program of a norm -> gate/up GEMV -> gated activation operator (this one, fused_norm_geglu):
    ``kernels`` its float, INT8 and INT4 KernelDefs."""
    def program(variants) -> dict:
        F = {"floordiv": [shape("weight", 0), 2]}
        launches, checks = format_launches(op, kernels, variants,
                                           lambda v: [cdiv(F, v.constexprs["BLOCK_N"]), shape("x", 0), 1])
        return program_doc(
            op, ["x", "norm_weight", "weight", "scale", *INT4_INPUTS], ["scale", *INT4_INPUTS], ["eps", *INT4_ATTRS],
            checks=checks + [
                weight_columns_check(shape("x", 1), "weight columns must equal x's width"),
                check("multiple_of", shape("weight", 0), 2, "weight packs gate and up rows: an even count"),
            ],
            let=[],
            buffers=[{"name": "y", "shape": [shape("x", 0), F], "dtype": {"like": "x"}}],
            launches=launches,
            outputs=["y"],
        )

    return program


program = gate_up_program(OP_NAME, (FP, W8, W4))
OP = OpKernels(op=OP_NAME, kernels=(FP, W8, W4), program=program, prepare=prepare,
               required=((FP.kernel, W8.kernel, W4.kernel),))
