"""RMSNorm -> gate/up GEMV -> GeGLU as one Triton kernel.

Reference: ``kernels/fused_norm_geglu.py``. ``fused_norm_swiglu``'s kernel with the
GELU-tanh gate: a program owns BLOCK_N columns of the MLP's hidden layer (gate row
n and up row F + n, interleaved: ``_gate_up_rows``), its tiles and defaults are
that kernel's (the same weight shape). gelu_tanh(g) = g * sigmoid(2 u),
u = sqrt(2 / pi) (g + 0.044715 g^3): the identity 0.5 (1 + tanh(u)) = sigmoid(2 u)
(FP32). Grid: (cdiv(F, BLOCK_N), B).
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgekit.kernels.fused_gemv_triton import (
    _epilogue_apply, _epilogue_operands, _gemv_rows, _pdl_enter_gemv, weight_kernels,
)
from edgekit.kernels.fused_norm_swiglu_triton import (
    _default, _default_w4, _default_w8, _gate_up_rows, _params, _space, gate_up_program,
)
from edgekit.kernels.kernel_def import OpKernels
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.fused_norm_geglu import prepare

OP_NAME = "fused_norm_geglu"


@triton.jit
def _norm_geglu_kernel(
    x_ptr, nw_ptr, w_ptr, s_ptr, y_ptr, F, C, stride_xm, stride_wn, stride_ym, eps,
    sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, W_FORMAT: tl.constexpr, STAGES: tl.constexpr = 1,
    PDL: tl.constexpr = 0,
):
    pid, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    rows = _gate_up_rows(pid, F, BLOCK_N)
    _pdl_enter_gemv(w_ptr, rows, C, stride_wn, BLOCK_K, W_FORMAT, PDL)
    scale, no_bias = _epilogue_operands(s_ptr, s_ptr, rows, 0, W_FORMAT)  # loaded while the weights stream
    acc = _gemv_rows(x_ptr + b * stride_xm, nw_ptr, eps, w_ptr, rows, C, stride_wn, True, W_FORMAT, 2 * BLOCK_N,
                     BLOCK_K, s_ptr, sh_ptr, oh_ptr, of_ptr, stride_sn, has_offset, scale_f32, group_shift, STAGES=STAGES)
    gu = _epilogue_apply(acc, scale, no_bias, 0, W_FORMAT, y_ptr.dtype.element_ty)  # gate and up as rounded
    g, u = tl.split(tl.reshape(gu, (BLOCK_N, 2)))
    inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)  # sqrt(2 / pi) (g + 0.044715 g^3)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(y_ptr + b * stride_ym + cols, (g * tl.sigmoid(2.0 * inner) * u).to(y_ptr.dtype.element_ty), mask=cols < F)


FP, W8, W4 = weight_kernels(OP_NAME, "norm_geglu", _norm_geglu_kernel, _params, ("BLOCK_N", "BLOCK_K"),
                            _space, _default, default_w8=_default_w8, default_w4=_default_w4,
                            rows_a_step=lambda c: 2 * c["BLOCK_N"])  # gate and up rows


program = gate_up_program(OP_NAME, (FP, W8, W4))
OP = OpKernels(op=OP_NAME, kernels=(FP, W8, W4), program=program, prepare=prepare,
               required=((FP.kernel, W8.kernel, W4.kernel),))
