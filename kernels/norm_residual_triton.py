"""norm_residual as a Triton kernel: one program per row, the whole row in registers.

Reference: ``kernels/norm_residual.py``. Reads the branch x, the residual and
the weight once and writes the new residual stream; no shared memory beyond
the cross-warp reduction. Grid: (B,).
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgekit.kernels.kernel_def import KernelDef, OpKernels, Param, launch_of, program_doc
from edgekit.kernels.launch_rule import attr, check, ptr, shape, stride
from edgekit.kernels.pdl_triton import _pdl_enter
from edgekit.kernels.rmsnorm_triton import row_default, row_space
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.norm_residual import prepare

OP_NAME = "norm_residual"


@triton.jit
def _norm_residual_kernel(x_ptr, nw_ptr, r_ptr, y_ptr, stride_xm, stride_rm, stride_ym, N, eps, BLOCK_N: tl.constexpr,
                          PDL: tl.constexpr = 0):
    _pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    rstd = tl.math.div_rn(1.0, tl.math.sqrt_rn(tl.math.div_rn(tl.sum(x * x, axis=0), N * 1.0) + eps))  # IEEE
    w = tl.load(nw_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    normed = (x * rstd * w).to(y_ptr.dtype.element_ty).to(tl.float32)  # rounded as rmsnorm writes it
    r = tl.load(r_ptr + row * stride_rm + cols, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    tl.store(y_ptr + row * stride_ym + cols, (r + normed).to(y_ptr.dtype.element_ty), mask=mask)


NORM_RESIDUAL_FWD = KernelDef(
    op=OP_NAME,
    kernel="norm_residual_fwd",
    fn=_norm_residual_kernel,
    params=(
        Param("x_ptr", "*act", ptr("x")),
        Param("nw_ptr", "*act", ptr("weight")),
        Param("r_ptr", "*act", ptr("residual")),
        Param("y_ptr", "*act", ptr("y")),
        Param("stride_xm", "i32", stride("x", 0), div16=True),
        Param("stride_rm", "i32", stride("residual", 0), div16=True),
        Param("stride_ym", "i32", stride("y", 0), div16=True),
        Param("N", "i32", shape("x", 1)),
        Param("eps", "fp32", attr("eps")),
    ),
    constexpr_names=("BLOCK_N",),
    precision={"input": "{act}", "accumulate": "fp32", "output": "{act}"},
    uses_shared_memory=False,
    space=row_space,
    default=row_default,
    smem_estimate=lambda c, warps, stages, nbytes: 4 * warps,  # cross-warp partial sums
    pdl=True,  # a link of the fused decode step's kernel chain (kernels/pdl_triton.py)
)


def program(variants) -> dict:
    v = variants[NORM_RESIDUAL_FWD.kernel]
    rows, cols = shape("x", 0), shape("x", 1)
    return program_doc(
        OP_NAME, ["x", "weight", "residual"], [], ["eps"],
        checks=[
            check("eq", shape("weight", 0), cols, "weight length must equal the row length"),
            check("eq", shape("residual", 0), rows, "residual must have as many rows as x"),
            check("eq", shape("residual", 1), cols, "residual rows must be as long as x's"),
            check("le", cols, v.constexprs["BLOCK_N"], "row length must fit the compiled BLOCK_N"),
        ],
        let=[],
        buffers=[{"name": "y", "shape": [rows, cols], "dtype": {"like": "x"}}],
        launches=[launch_of(NORM_RESIDUAL_FWD, [rows, 1, 1])],
        outputs=["y"],
    )


OP = OpKernels(op=OP_NAME, kernels=(NORM_RESIDUAL_FWD,), program=program, prepare=prepare,
               required=((NORM_RESIDUAL_FWD.kernel,),))
