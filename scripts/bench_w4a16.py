#!/usr/bin/env python3
"""W4A16 (INT4 weight-only) GEMV and GEMM against their baselines, in one run, on a CUDA GPU.

- GEMV (decode, M = 1) at shapes with >= 32 MB of INT4 weights: edgekit's W4A16 kernel (default variant and a
  few GEMV tiles) vs fp16 ``F.linear`` (cuBLAS) and edgekit's W8A16 GEMV on the same shape; achieved bandwidth
  counts the bytes actually read (packed weights + group scales + offsets + x) against the device copy
  bandwidth, (read + write) / time, measured in the same run.
- GEMM (prefill, M = 512): W4A16 vs fp16 F.linear.

Every time is CUDA-graph replay, per call, with the calls cycling through enough weight copies to exceed
4x the L2 (scripts/bench_kernels.py: graph_time_us, copies_for), so the figures are HBM figures measured on
the GPU named in the output. Prints a table; --json PATH writes everything.

    python scripts/bench_w4a16.py --json $OUT/bench_w4a16.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from bench_kernels import copies_for, copy_bandwidth_gbps, graph_time_us
from edgekit.kernels.int4_layout import pack_int4
from edgekit.kernels.triton_backend import TritonOp
from edgekit.kernels.variants import KernelVariant, default_variants

H = torch.float16
OP = "linear_w4a16"
GROUP = 128
# (name, N, K): INT4 bytes N * K / 2 >= 32 MB
GEMV_SHAPES = [("llama-3.1-8b w_gate_up", 28672, 4096), ("llama-3.2-1b lm_head", 128256, 2048),
               ("llama-3.1-8b w_down x2", 8192, 14336)]
# (BLOCK_N, BLOCK_K, warps, DECODE): the weight decodes (1: words, x one by one; 2: words, x in runs; 0: bytes)
# at the tiles the SASS count favoured (about 9-11 instructions a weight byte), beside the default
GEMV_TILES = [(32, 512, 4, 1), (64, 512, 4, 2), (32, 512, 4, 0), (128, 256, 8, 2)]
# decode on the tensor-core GEMM instead (x padded to BLOCK_M rows): the alternative the INT8 GEMV measured
GEMM_FOR_DECODE = [({"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8}, 4, 3)]
TARGETS = {"fraction_of_copy": 0.85, "time_vs_fp16": 0.35}


def int4_weights(N: int, K: int, n: int) -> list[tuple]:
    out = []
    for _ in range(n):
        q = pack_int4(torch.randint(0, 16, (N, K), dtype=torch.uint8, device="cuda"))
        s = (torch.rand(N, K // GROUP, device="cuda") * 1e-3 + 1e-4).to(H)
        out.append((q, s, -8 * s))
    return out


def gemv_candidates() -> list[dict]:
    dv = default_variants(OP, rows=1)
    gemv = [{"w4a16_gemv": KernelVariant(OP, "w4a16_gemv", {"BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk, "DECODE": d},
                                         w, 1)} for bn, bk, w, d in GEMV_TILES]
    gemm = [{"w4a16_gemm": KernelVariant(OP, "w4a16_gemm", c, w, st)} for c, w, st in GEMM_FOR_DECODE]
    return [dv] + [c for c in gemv + gemm if c != dv]


def bench_gemv(copy_gbps: float, l2: int, quick: bool, log, rows: list, sweep: bool = True) -> list[dict]:
    """The first shape sweeps every candidate; the others time the default and the first shape's best.
    Appends to ``rows`` as each shape finishes (a run cut short keeps what it measured)."""
    best_first = None
    for name, N, K in GEMV_SHAPES[:1] if quick else GEMV_SHAPES:
        x = torch.randn(1, K, device="cuda", dtype=H)
        n4 = copies_for(N * K // 2, l2)
        ws4 = int4_weights(N, K, n4)
        t_fp16 = graph_time_us([lambda w=w: F.linear(x, w)
                                for w in [torch.randn(N, K, device="cuda", dtype=H) for _ in range(copies_for(2 * N * K, l2))]])
        torch.cuda.empty_cache()
        n8 = copies_for(N * K, l2)
        w8 = [(torch.randint(-127, 128, (N, K), device="cuda", dtype=torch.int8), torch.rand(N, device="cuda") / 1e3)
              for _ in range(n8)]
        op8 = TritonOp("linear_w8a16")
        t_int8 = graph_time_us([lambda q=q, s=s: op8(x, q, s, None) for q, s in w8])
        del w8
        torch.cuda.empty_cache()
        results = []
        if quick or not sweep:
            cands = gemv_candidates()[:1]
        elif best_first is None:
            cands = gemv_candidates()
        else:
            cands = [c for c in gemv_candidates() if c == default_variants(OP, rows=1) or c == best_first]
        for cand in cands:
            op = TritonOp(OP, cand)
            try:
                t = graph_time_us([lambda q=q, s=s, m=m: op(x, q, s, m, None) for q, s, m in ws4])
            except Exception as e:  # a tile that does not compile or launch here is reported, not fatal
                log(f"  skip {[v.label() for v in cand.values()]}: {type(e).__name__}: {str(e)[:160]}")
                continue
            results.append({"variant": " + ".join(v.label() for v in cand.values()), "us": t,
                            "default": cand == default_variants(OP, rows=1), "_cand": cand})
        best = min(results, key=lambda r: r["us"])
        best_first = best_first or best["_cand"]
        for r in results:
            r.pop("_cand")
        default = next(r for r in results if r["default"])
        read = N * K // 2 + 2 * 2 * N * (K // GROUP) + 2 * K  # packed weights + fp16 scales and offsets + x
        row = {"shape": name, "N": N, "K": K, "int4_weight_mb": N * K / 2 / 1e6, "weight_copies": n4,
               "bytes_read_per_call": read, "default_us": default["us"], "best_us": best["us"],
               "best_variant": best["variant"], "fp16_linear_us": t_fp16, "w8a16_us": t_int8,
               "default_fraction_of_copy": read / (default["us"] * 1e-6) / 1e9 / copy_gbps,
               "best_fraction_of_copy": read / (best["us"] * 1e-6) / 1e9 / copy_gbps,
               "default_time_vs_fp16": default["us"] / t_fp16, "best_time_vs_fp16": best["us"] / t_fp16,
               "default_time_vs_w8a16": default["us"] / t_int8, "tiles": results}
        rows.append(row)
        log(f"gemv {name:24s} {row['int4_weight_mb']:6.1f} MB int4  default {default['us']:6.1f} us "
            f"({row['default_fraction_of_copy'] * 100:4.1f}% copy, {row['default_time_vs_fp16']:.2f}x fp16)  "
            f"best {best['us']:6.1f} us ({row['best_fraction_of_copy'] * 100:4.1f}%, {row['best_time_vs_fp16']:.2f}x)  "
            f"fp16 {t_fp16:6.1f} us  w8a16 {t_int8:6.1f} us  best tile {best['variant']}")
        del ws4
        torch.cuda.empty_cache()
    return rows


def bench_gemm(log) -> list[dict]:
    """The prefill GEMM (default tiles, and 128 x 128 at 8 warps) against fp16 F.linear on the same shape."""
    rows = []
    for name, M, N, K in (("llama-3.1-8b w_gate_up prefill", 512, 28672, 4096),):
        x = torch.randn(M, K, device="cuda", dtype=H)
        (q, s, m), = int4_weights(N, K, 1)
        w = torch.randn(N, K, device="cuda", dtype=H)
        t_f = graph_time_us([lambda: F.linear(x, w)], min_calls=4)
        flops = 2 * M * N * K
        big = {"w4a16_gemm": KernelVariant(OP, "w4a16_gemm", {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8},
                                           8, 3)}
        for label, op in (("default", TritonOp(OP)), ("128x128x64 w8", TritonOp(OP, big))):
            t_e = graph_time_us([lambda op=op: op(x, q, s, m, None)], min_calls=4)
            row = {"shape": name, "tiles": label, "M": M, "N": N, "K": K, "edgekit_us": t_e, "fp16_linear_us": t_f,
                   "edgekit_tflops": flops / t_e / 1e6, "fp16_tflops": flops / t_f / 1e6, "time_vs_fp16": t_e / t_f,
                   "variant": " + ".join(v.label() for v in (op._fixed or default_variants(OP, rows=M)).values())}
            rows.append(row)
            log(f"gemm {name:32s} {label:14s} edgekit {row['edgekit_tflops']:6.1f} TF/s  "
                f"fp16 F.linear {row['fp16_tflops']:6.1f} TF/s  t/fp16 {row['time_vs_fp16']:.2f}")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true", help="one shape, default tiles only")
    ap.add_argument("--no-sweep", action="store_true", help="every shape and the GEMM, default tiles only")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_w4a16: needs a CUDA GPU (run it on the GPU machine)", file=sys.stderr)
        return 2

    def log(msg: str) -> None:
        print(msg, flush=True)

    props = torch.cuda.get_device_properties(0)
    l2 = int(getattr(props, "L2_cache_size", 60 << 20))
    copy = copy_bandwidth_gbps()
    log(f"device {props.name}: copy bandwidth {copy['best']:.0f} GB/s ((read + write) / time), L2 {l2 >> 20} MB")
    doc = {"measured_on": f"GPU: {props.name} (CUDA-graph replay, working sets >= 4x L2)", "torch": torch.__version__,
           "copy_gbps": copy, "gemv": [], "gemm": [], "goals": {}}

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)

    gemv = doc["gemv"]
    bench_gemv(copy["best"], l2, args.quick, lambda msg: (log(msg), save()), gemv, sweep=not args.no_sweep)
    if not args.quick:
        doc["gemm"] = bench_gemm(log)
    doc["goals"] = goals = {
        "W4A16 GEMV >= 85% of copy bandwidth (>= 32 MB int4, default tiles)": {
            "min": min(r["default_fraction_of_copy"] for r in gemv),
            "met": min(r["default_fraction_of_copy"] for r in gemv) >= TARGETS["fraction_of_copy"]},
        "W4A16 GEMV <= 0.35x fp16 F.linear time (default tiles)": {
            "max": max(r["default_time_vs_fp16"] for r in gemv),
            "met": max(r["default_time_vs_fp16"] for r in gemv) <= TARGETS["time_vs_fp16"]},
    }
    for k, v in goals.items():
        log(f"goal {k}: {v}")
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
