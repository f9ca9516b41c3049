"""Triton specializes an integer argument equal to 1 into a constexpr: a kernel must compile both ways.

Found on the H200: rmsnorm on rows of length 1 failed to compile (``N.to(...)`` on a constexpr).
Cross-compiled here for sm_90 without a GPU.
"""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")


@pytest.mark.parametrize("n_kind", ["constexpr", "i32"])
def test_rmsnorm_compiles_with_row_length_specialized(n_kind):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from edgekit.kernels.rmsnorm_triton import _rmsnorm_kernel

    sig = {"x_ptr": "*fp16", "w_ptr": "*fp16", "y_ptr": "*fp16", "stride_xm": "i32", "stride_ym": "i32",
           "N": n_kind, "eps": "fp32", "BLOCK_N": "constexpr"}
    constexprs = {"BLOCK_N": 16, **({"N": 1} if n_kind == "constexpr" else {})}
    k = triton.compile(ASTSource(_rmsnorm_kernel, sig, constexprs=constexprs), target=GPUTarget("cuda", 90, 32))
    assert k.asm["cubin"]
