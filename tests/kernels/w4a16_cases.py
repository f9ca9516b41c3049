"""Random W4A16 linear cases and their FP64 oracle check, shared by the interpreter and GPU tests.

``check_case`` draws INT4 codes, group scales (FP16 or FP32) and offsets (or the symmetric form), runs
``fn`` (the operator's Triton implementation, called like ``DispatchTable.linear_w4a16``) and returns the
worst error / allowance ratio against ``fp64_oracle.linear_w4a16`` (<= 1 passes), with the operator's
tolerance for the activation dtype.
"""

from __future__ import annotations

import torch

import fp64_oracle as oracle
from edgekit.kernels.int4_layout import pack_int4
from edgekit.kernels.registry import OPERATORS

ACT = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def w4a16_inputs(*, M: int, K: int, N: int, group: int, symmetric: bool, scale_dtype: torch.dtype, bias: bool,
                 act: str, seed: int, device) -> tuple:
    """(x, qweight, scale, offset, bias) with outputs O(1): scales ~ 1/(8 sqrt K), offsets near -8 scale."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    scale = (torch.rand(N, K // group, generator=g) + 0.5) / (8 * K ** 0.5)
    offset = None if symmetric else -scale * (8 + torch.randn(N, K // group, generator=g))
    x = torch.randn(M, K, generator=g)
    b = 0.1 * torch.randn(N, generator=g) if bias else None
    dt = ACT[act]
    return (x.to(dt).to(device), pack_int4(q).to(device), scale.to(scale_dtype).to(device),
            None if offset is None else offset.to(scale_dtype).to(device), None if b is None else b.to(dt).to(device))


def check_case(fn, **case) -> float:
    args = w4a16_inputs(**case)
    got = fn(*args)
    assert got.dtype == args[0].dtype and got.shape == (case["M"], case["N"])
    want = oracle.linear_w4a16(*args)
    tol = OPERATORS["linear_w4a16"].spec.tolerance_for(str(args[0].dtype).removeprefix("torch."))
    return oracle.within(got, want, tol.atol, tol.rtol)[1]
