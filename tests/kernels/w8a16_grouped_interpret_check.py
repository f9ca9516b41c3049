"""Run under TRITON_INTERPRET=1 by test_w8a16_grouped_triton.py: the grouped INT8 GEMV against the FP64 oracle
(an FP64 sum over groups) on a few shapes; prints one JSON line of {case, ratio} (error / allowed tolerance)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import fp64_oracle as oracle  # noqa: E402

from edgekit.kernels.int8_group_layout import quantize_int8_grouped  # noqa: E402
from edgekit.kernels.linear_w8a16_grouped import W8A16_GROUPED_SPEC  # noqa: E402
from edgekit.kernels.linear_w8a16_grouped_triton import linear_w8a16_grouped_triton  # noqa: E402


def fp64(x, q, s, b):
    g = q.shape[1] // s.shape[1]
    w = q.to(torch.float64) * s.to(torch.float64).repeat_interleave(g, dim=1)
    y = x.to(torch.float64) @ w.T
    return y + b.to(torch.float64) if b is not None else y


results = []
gen = torch.Generator().manual_seed(0)
# (M, N, K, G, scale dtype, bias, block_n, groups): N not a multiple of the block, K not a multiple of BLOCK_K
for m, n, k, g, sdt, bias, bn, gr in [(1, 50, 96, 32, torch.float16, True, 32, 2), (3, 64, 128, 64, torch.float32, False, 16, 1),
                                     (1, 17, 256, 128, torch.float16, False, 32, 1), (2, 40, 160, 32, torch.float16, True, 8, 4)]:
    q, s = quantize_int8_grouped(torch.randn(n, k, generator=gen) * 2, g, sdt)
    x = torch.randn(m, k, generator=gen).to(torch.float16)
    b = torch.randn(n, generator=gen).to(torch.float16) if bias else None
    got = linear_w8a16_grouped_triton(x, q, s, b, block_n=bn, groups=gr)
    tol = W8A16_GROUPED_SPEC.tolerance_for("float16")
    ok, ratio = oracle.within(got, fp64(x, q, s, b), tol.atol, tol.rtol)
    results.append({"case": f"M={m} N={n} K={k} G={g} {sdt} bias={bias} BN={bn} GROUPS={gr}", "ratio": float(ratio)})
print(json.dumps(results))
