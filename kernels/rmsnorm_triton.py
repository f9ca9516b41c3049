"""RMSNorm as a Triton kernel: one program per row, the whole row in registers.

Reference: ``kernels/rmsnorm.py``. The row is read once, squared and summed in
FP32, and written once: the kernel is memory-bound and needs no shared memory
beyond the cross-warp reduction.
"""

from __future__ import annotations

import triton
import triton.language as tl

from edgekit.kernels.kernel_def import KernelDef, OpKernels, Param, launch_of, pow2_at_least, program_doc
from edgekit.kernels.launch_rule import attr, check, ptr, shape, stride
# the host side (call checks, canonical form) lives with the operator: a device loads plugins without Triton
from edgekit.kernels.rmsnorm import MAX_ROW, prepare  # noqa: F401 (re-exported)


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, stride_xm, stride_ym, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_N,)
    rstd = tl.math.div_rn(1.0, tl.math.sqrt_rn(tl.math.div_rn(tl.sum(x * x, axis=0), N * 1.0) + eps))  # IEEE, not approximate
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_ym + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def row_space(s: dict) -> list:
    """Whole-row tiles (one program per row) for a row of ``hidden_size``: shared by the row-wise norms."""
    block = pow2_at_least(int(s.get("hidden_size", 4096)), 16)
    return [({"BLOCK_N": block}, w, 1) for w in (1, 2, 4, 8, 16) if block >= 32 * w]


def row_default(s: dict):
    block = pow2_at_least(int(s.get("hidden_size", 4096)), 16)
    return {"BLOCK_N": block}, max(1, min(8, block // 512)), 1


RMSNORM_FWD = KernelDef(
    op="rmsnorm",
    kernel="rmsnorm_fwd",
    fn=_rmsnorm_kernel,
    params=(
        Param("x_ptr", "*act", ptr("x")),
        Param("w_ptr", "*act", ptr("weight")),
        Param("y_ptr", "*act", ptr("y")),
        Param("stride_xm", "i32", stride("x", 0), div16=True),
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
)


def program(variants) -> dict:
    v = variants["rmsnorm_fwd"]
    return program_doc(
        "rmsnorm", ["x", "weight"], [], ["eps"],
        checks=[
            check("eq", shape("weight", 0), shape("x", 1), "weight length must equal the row length"),
            check("le", shape("x", 1), v.constexprs["BLOCK_N"], "row length must fit the compiled BLOCK_N"),
        ],
        let=[],
        buffers=[{"name": "y", "shape": [shape("x", 0), shape("x", 1)], "dtype": {"like": "x"}}],
        launches=[launch_of(RMSNORM_FWD, [shape("x", 0), 1, 1])],
        outputs=["y"],
    )


OP = OpKernels(op="rmsnorm", kernels=(RMSNORM_FWD,), program=program, prepare=prepare, required=(("rmsnorm_fwd",),))
