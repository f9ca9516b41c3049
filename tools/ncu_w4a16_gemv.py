#!/usr/bin/env python3
"""Launch the W4A16 GEMV a few times at one shape and tile, for Nsight Compute to profile (GPU only).

Nothing is timed here: ``tools/gpu_ncu_w4a16.sh`` runs this under ``ncu`` (caches flushed before each profiled
launch, clocks unlocked) and keeps its sections (speed of light, occupancy, launch stats, warp stall reasons,
memory workload) as CSV, which say why a tile stops short of the copy bandwidth.

    python3 tools/ncu_w4a16_gemv.py --n 28672 --k 4096 --tile 64,256,2,3
"""

from __future__ import annotations

import argparse

import torch

from bench_w4a16 import GROUP, OP, int4_weights
from edgekit.kernels.triton_backend import TritonOp
from edgekit.kernels.variants import KernelVariant


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, required=True, help="weight rows (outputs)")
    ap.add_argument("--k", type=int, required=True, help="weight columns (inputs), a multiple of the group")
    ap.add_argument("--tile", required=True, help="BLOCK_N,BLOCK_K,num_warps,DECODE")
    ap.add_argument("--launches", type=int, default=5)
    a = ap.parse_args()
    if a.k % GROUP:
        raise SystemExit(f"--k {a.k} is not a multiple of the group {GROUP}")
    bn, bk, warps, decode = (int(v) for v in a.tile.split(","))
    op = TritonOp(OP, {"w4a16_gemv": KernelVariant(
        OP, "w4a16_gemv", {"BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk, "DECODE": decode}, warps, 1)})
    x = torch.randn(1, a.k, device="cuda", dtype=torch.float16)
    q, s, m = int4_weights(a.n, a.k, 1)[0]
    for _ in range(a.launches):
        op(x, q, s, m, None)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
