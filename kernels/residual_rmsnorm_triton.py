"""Residual add + RMSNorm as a Triton kernel: one program per row, the whole row in registers.

Reference: ``kernels/residual_rmsnorm.py``. Reads x and the residual once,
writes the sum (the new residual stream) and the normalised row; no shared
memory beyond the cross-warp reduction.
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgekit.kernels.kernel_def import KernelDef, OpKernels, Param, launch_of, program_doc
from edgekit.kernels.launch_rule import attr, check, ptr, shape, stride
from edgekit.kernels.rmsnorm_triton import row_default, row_space
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.residual_rmsnorm import prepare


@triton.jit
def _residual_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, stride_xm, stride_rm, stride_ym, stride_sm, N, eps,
                             BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_N,)
    r = tl.load(r_ptr + row * stride_rm + cols, mask=mask, other=0.0).to(tl.float32)
    s = (x + r).to(s_ptr.dtype.element_ty)  # rounded like the unfused add
    tl.store(s_ptr + row * stride_sm + cols, s, mask=mask)
    sf = s.to(tl.float32)
    rstd = tl.math.div_rn(1.0, tl.math.sqrt_rn(tl.math.div_rn(tl.sum(sf * sf, axis=0), N * 1.0) + eps))  # IEEE
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_ym + cols, (sf * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


RESIDUAL_RMSNORM_FWD = KernelDef(
    op="residual_rmsnorm",
    kernel="residual_rmsnorm_fwd",
    fn=_residual_rmsnorm_kernel,
    params=(
        Param("x_ptr", "*act", ptr("x")),
        Param("r_ptr", "*act", ptr("residual")),
        Param("w_ptr", "*act", ptr("weight")),
        Param("y_ptr", "*act", ptr("y")),
        Param("s_ptr", "*act", ptr("s")),
        Param("stride_xm", "i32", stride("x", 0), div16=True),
        Param("stride_rm", "i32", stride("residual", 0), div16=True),
        Param("stride_ym", "i32", stride("y", 0), div16=True),
        Param("stride_sm", "i32", stride("s", 0), div16=True),
        Param("N", "i32", shape("x", 1)),
        Param("eps", "fp32", attr("eps")),
    ),
    constexpr_names=("BLOCK_N",),
    precision={"input": "{act}", "accumulate": "fp32", "output": "{act}"},
    uses_shared_memory=False,
    space=row_space,
    default=row_default,
    smem_estimate=lambda c, warps, stages, nbytes: 4 * warps,  # cross-warp partial sums
)


def program(variants) -> dict:
    v = variants["residual_rmsnorm_fwd"]
    rows, cols = shape("x", 0), shape("x", 1)
    return program_doc(
        "residual_rmsnorm", ["x", "residual", "weight"], [], ["eps"],
        checks=[
            check("eq", shape("residual", 0), rows, "residual must have as many rows as x"),
            check("eq", shape("residual", 1), cols, "residual rows must be as long as x's"),
            check("eq", shape("weight", 0), cols, "weight length must equal the row length"),
            check("le", cols, v.constexprs["BLOCK_N"], "row length must fit the compiled BLOCK_N"),
        ],
        let=[],
        buffers=[{"name": "y", "shape": [rows, cols], "dtype": {"like": "x"}},
                 {"name": "s", "shape": [rows, cols], "dtype": {"like": "x"}}],
        launches=[launch_of(RESIDUAL_RMSNORM_FWD, [rows, 1, 1])],
        outputs=["y", "s"],
    )


OP = OpKernels(op="residual_rmsnorm", kernels=(RESIDUAL_RMSNORM_FWD,), program=program, prepare=prepare,
               required=(("residual_rmsnorm_fwd",),))
