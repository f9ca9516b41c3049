"""Split-KV decode attention with its combine, then the output projection, as two Triton kernels (no residual).

Reference: ``kernels/fused_attn_proj.py``. Launch 1 is ``fused_attn_proj_residual``'s
split-KV kernel as it is (the last split of each (sequence, KV head) to arrive
merges the head's splits and writes the attention output ``o``, rounded to the
activation dtype; ``arrivals`` counts them and is left at zero). Launch 2 is a
plain GEMV of ``o`` by the output weight (``fused_gemv_triton._gemv_rows``,
float / INT8 / INT4 weights), its tiles those of ``fused_proj_residual``.
Grid: (NUM_SPLITS, B * Hkv) then (cdiv(N, BLOCK_N), B).
"""

from __future__ import annotations

import dataclasses

import triton
import triton.language as tl

from edgekit.kernels.fused_attn_proj_residual_triton import SPLIT as SPLIT_WITH_RESIDUAL
from edgekit.kernels.fused_attn_proj_residual_triton import attn_proj_program, o_proj_params
from edgekit.kernels.fused_gemv_triton import (
    _epilogue_apply, _epilogue_operands, _gemv_rows, _pdl_enter_gemv, weight_kernels,
)
from edgekit.kernels.fused_proj_residual_triton import _default as _proj_default
from edgekit.kernels.fused_proj_residual_triton import _space as _proj_space
from edgekit.kernels.kernel_def import OpKernels
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.fused_attn_proj import prepare

OP_NAME = "fused_attn_proj"


@triton.jit
def _attn_o_proj_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, N, K, stride_xm, stride_wn, stride_ym, has_bias,
    sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, W_FORMAT: tl.constexpr, STAGES: tl.constexpr = 1,
    PDL: tl.constexpr = 0,
):
    """BLOCK_N output rows of sequence b: y = o @ W[rows].T (+ bias), rounded to the activation dtype."""
    pid, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_ld = rows % N  # rows past N read valid memory; never stored
    _pdl_enter_gemv(w_ptr, rows_ld, K, stride_wn, BLOCK_K, W_FORMAT, PDL)
    scale, bias = _epilogue_operands(s_ptr, b_ptr, rows_ld, has_bias, W_FORMAT)  # loaded while the weights stream
    acc = _gemv_rows(x_ptr + b * stride_xm, x_ptr, 1.0, w_ptr, rows_ld, K, stride_wn, False, W_FORMAT, BLOCK_N, BLOCK_K,
                     s_ptr, sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift, STAGES=STAGES)
    y = _epilogue_apply(acc, scale, bias, has_bias, W_FORMAT, y_ptr.dtype.element_ty)
    tl.store(y_ptr + b * stride_ym + rows, y.to(y_ptr.dtype.element_ty), mask=rows < N)


SPLIT = dataclasses.replace(SPLIT_WITH_RESIDUAL, op=OP_NAME)  # the same kernel: its output is the o buffer


FP, W8, W4 = weight_kernels(OP_NAME, "attn_o_proj", _attn_o_proj_kernel, o_proj_params(residual=False),
                            ("BLOCK_N", "BLOCK_K"), _proj_space, _proj_default,
                            default_w4=lambda s: _proj_default(s, int4=True))


program = attn_proj_program(OP_NAME, SPLIT, (FP, W8, W4), residual=False)
OP = OpKernels(op=OP_NAME, kernels=(SPLIT, FP, W8, W4), program=program, prepare=prepare,
               required=((SPLIT.kernel,), (FP.kernel, W8.kernel, W4.kernel)))
