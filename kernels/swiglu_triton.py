"""Fused SwiGLU as a Triton kernel: reads the packed [gate | up] row once, writes silu(gate) * up.

Reference: ``kernels/swiglu.py``. Elementwise and memory-bound; no shared memory.
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgekit.kernels.kernel_def import KernelDef, OpKernels, Param, launch_of, program_doc
from edgekit.kernels.launch_rule import cdiv, check, ptr, shape, stride
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.swiglu import prepare


@triton.jit
def _swiglu_kernel(gu_ptr, y_ptr, stride_gm, stride_ym, F, BLOCK_F: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = cols < F
    gate = tl.load(gu_ptr + row * stride_gm + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_F,)
    up = tl.load(gu_ptr + row * stride_gm + F + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up  # silu(gate) * up, in FP32
    tl.store(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _space(s: dict) -> list:
    return [({"BLOCK_F": b}, w, 1) for b in (256, 512, 1024, 2048) for w in (1, 2, 4, 8) if b >= 64 * w]


SWIGLU_FWD = KernelDef(
    op="swiglu",
    kernel="swiglu_fwd",
    fn=_swiglu_kernel,
    params=(
        Param("gu_ptr", "*act", ptr("gate_up")),
        Param("y_ptr", "*act", ptr("y")),
        Param("stride_gm", "i32", stride("gate_up", 0), div16=True),
        Param("stride_ym", "i32", stride("y", 0), div16=True),
        Param("F", "i32", shape("y", 1), div16=True),  # also the offset of `up`: aligned when F % 16 == 0
    ),
    constexpr_names=("BLOCK_F",),
    precision={"input": "{act}", "accumulate": "fp32", "output": "{act}"},
    uses_shared_memory=False,
    space=_space,
    default=lambda s: ({"BLOCK_F": 1024}, 4, 1),
    smem_estimate=lambda c, warps, stages, nbytes: 0,
)


def gated_program(kdef: KernelDef):
    """The launch program of a gated activation kernel over packed [gate | up] rows (SwiGLU's, GeGLU's)."""

    def program(variants) -> dict:
        block = variants[kdef.kernel].constexprs["BLOCK_F"]
        F = {"floordiv": [shape("gate_up", 1), 2]}
        return program_doc(
            kdef.op, ["gate_up"], [], [],
            checks=[check("multiple_of", shape("gate_up", 1), 2, "gate_up packs gate and up: its width must be even")],
            let=[],
            buffers=[{"name": "y", "shape": [shape("gate_up", 0), F], "dtype": {"like": "gate_up"}}],
            launches=[launch_of(kdef, [shape("gate_up", 0), cdiv(F, block), 1])],
            outputs=["y"],
        )

    return program


OP = OpKernels(op="swiglu", kernels=(SWIGLU_FWD,), program=gated_program(SWIGLU_FWD), prepare=prepare,
               required=(("swiglu_fwd",),))
