#!/usr/bin/env python3
"""Static speed proxy of the W4A16 decode GEMV, on a machine without a GPU: cross-compile variants for sm_87
(Orin) and sm_90 (H200) and read their SASS (kernels/sass_stats.py): instructions a weight byte in the K loop,
registers, spills, shared memory and the widths of the loop's global loads (128 = 16-byte LDG.E.128).

A GEMV at bandwidth must issue few instructions per byte it streams: the H200 sustained ~16 T SASS
instructions/s in the measured W4A16 GEMV (~10 a byte, 36.9% of copy bandwidth), so >= 85% of its ~4.3 TB/s
needs ~4 or fewer. The count is static: both sides of the kernel's runtime branches (FP16 or FP32 scales,
offsets or none) are in the loop, so it overstates what one call executes by a few percent.

    python tools/gemv_sass_report.py [--json out.json] [--arch 87,90]

Figures are compiler output read on the CPU (no GPU involved); the GPU timings are bench_w4a16.py's.
"""

from __future__ import annotations

import argparse
import json
import sys

from edgekit.kernels.aot import compile_variant
from edgekit.kernels.arch import arch_name
from edgekit.kernels.sass_stats import loop_stats
from edgekit.kernels.variants import KernelVariant, default_variants

OP = "linear_w4a16"
ORIN_SMEM_BUDGET = 128 * 1024
# (BLOCK_N, BLOCK_K, warps, DECODE): the half2 GEMV (DECODE 3) at the tiles bench_w4a16.py times, beside the
# default (the FP32 words path, DECODE 2)
CANDIDATES = [(64, 256, 2, 3), (128, 256, 4, 3), (32, 256, 1, 3), (128, 256, 2, 3), (256, 256, 4, 3), (128, 128, 2, 3)]


def variants() -> list[KernelVariant]:
    default = default_variants(OP, rows=1)["w4a16_gemv"]
    return [default] + [KernelVariant(OP, "w4a16_gemv", {"BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk, "DECODE": d}, w, 1)
                        for bn, bk, w, d in CANDIDATES]


def row_of(v: KernelVariant, arch: int, default: KernelVariant) -> dict:
    ck = compile_variant(v, arch, budget_bytes=ORIN_SMEM_BUDGET)
    st = loop_stats(ck.cubin)
    c = v.constexprs
    bytes_per_thread = c["BLOCK_N"] * c["BLOCK_K"] // 2 / (32 * v.num_warps)  # packed weight bytes a K step
    return {"variant": v.label(), "default": v == default, "arch": arch_name(arch), "decode": c["DECODE"],
            "registers": ck.registers, "spills": ck.spills, "shared_bytes": ck.shared_bytes,
            "fits_128kb": ck.shared_bytes <= ORIN_SMEM_BUDGET, "loop_instructions": st.instructions,
            "weight_bytes_per_thread_step": bytes_per_thread,
            "instructions_per_weight_byte": st.instructions / bytes_per_thread,
            "loop_global_loads_by_bits": st.global_loads, "loop_mix_top": dict(list(st.mix.items())[:10])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--arch", default="87,90")
    args = ap.parse_args()
    default = default_variants(OP, rows=1)["w4a16_gemv"]
    rows = [row_of(v, int(a), default) for v in variants() for a in args.arch.split(",")]
    print(f"{'arch':5} {'instr/B':>7} {'loop':>5} {'regs':>4} {'spill':>5} {'smem':>6} {'LDG bits':18}  variant")
    for r in rows:
        by_bits = sorted(r["loop_global_loads_by_bits"].items(), key=lambda kv: -int(kv[0]))
        loads = ",".join(f"{k}x{n}" for k, n in by_bits)
        print(f"{r['arch']:5} {r['instructions_per_weight_byte']:7.2f} {r['loop_instructions']:5} "
              f"{r['registers'] or -1:4} {(r['spills'] or {}).get('stores', -1):5} {r['shared_bytes']:6} {loads:18}  "
              f"{r['variant']}{'  (default)' if r['default'] else ''}")
    doc = {"measured_on": "static: cross-compiled on the CPU (no GPU), SASS read with Triton's nvdisasm",
           "kernels": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0 if all(r["fits_128kb"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
