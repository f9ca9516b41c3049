"""Fused GeGLU as a Triton kernel: reads the packed [gate | up] row once, writes gelu_tanh(gate) * up.

Reference: ``kernels/geglu.py``. Elementwise and memory-bound; no shared memory.
The launch program is SwiGLU's (same layout), with this kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgekit.kernels.geglu import GELU_TANH_C, GELU_TANH_CUBIC
from edgekit.kernels.kernel_def import KernelDef, OpKernels
from edgekit.kernels.swiglu_triton import SWIGLU_FWD, gated_program
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.geglu import prepare

_C = tl.constexpr(GELU_TANH_C)  # a jitted function reads module constants only as constexprs
_CUBIC = tl.constexpr(GELU_TANH_CUBIC)


@triton.jit
def _geglu_kernel(gu_ptr, y_ptr, stride_gm, stride_ym, F, BLOCK_F: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = cols < F
    gate = tl.load(gu_ptr + row * stride_gm + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_F,)
    up = tl.load(gu_ptr + row * stride_gm + F + cols, mask=mask, other=0.0).to(tl.float32)
    z = _C * (gate + _CUBIC * gate * gate * gate)
    y = gate * tl.sigmoid(z) * up  # gelu_tanh(gate) * up, in FP32
    tl.store(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


GEGLU_FWD = KernelDef(**{**SWIGLU_FWD.__dict__, "op": "geglu", "kernel": "geglu_fwd", "fn": _geglu_kernel})

OP = OpKernels(op="geglu", kernels=(GEGLU_FWD,), program=gated_program(GEGLU_FWD), prepare=prepare,
               required=(("geglu_fwd",),))
