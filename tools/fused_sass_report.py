#!/usr/bin/env python3
"""Static speed proxy of the fused decode GEMVs per weight format, on a machine without a GPU: cross-compile the
float, INT8 (W8A16) and INT4 (W4A16) kernels of the four layer operators at a preset's shapes (their default tiles)
for sm_87 / sm_90 and read the SASS of their K loop (kernels/sass_stats.py): instructions a weight and a weight byte,
registers, spills, shared memory, global-load widths.

Decode is memory-bound only while a kernel issues few instructions per byte it streams (the H200 sustained ~16 T
SASS instructions/s in the measured W4A16 GEMV, tools/gemv_sass_report.py): INT4 halves INT8's bytes, so it can
only reach ~2x INT8's speed at no more instructions a weight than INT8's. The count is static (both sides of runtime
branches, e.g. FP16 or FP32 scales, are in the loop) and includes each step's activation work (RMSNorm, the
attention combine); it is a proxy, not a measurement: scripts/gpu_int4_fused.sh times the decode step on the GPU.

    python tools/fused_sass_report.py [--preset llama-3.2-1b] [--arch 87,90] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys

from edgekit.kernels.aot import compile_variant
from edgekit.kernels.arch import arch_name
from edgekit.kernels.sass_stats import loop_stats
from edgekit.kernels.variants import default_variants
from edgekit.model.presets import preset_config
from edgekit.plan.tiles import step_weight_shape

OPS = ("fused_norm_qkv_rope", "fused_attn_proj_residual", "fused_norm_swiglu", "fused_proj_residual")
ORIN_SMEM_BUDGET = 128 * 1024
WEIGHT_BYTES = {"fp": 2.0, "w8": 1.0, "w4": 0.5}


def rows_a_step(op: str, c: dict) -> int:
    """Weight rows one program multiplies a K step (the interleaved ops hold two per column / rotation pair)."""
    return 2 * c["PAIRS"] if op == "fused_norm_qkv_rope" else 2 * c["BLOCK_N"] if op == "fused_norm_swiglu" else c["BLOCK_N"]


def rows(preset: str, archs: list[int]) -> list[dict]:
    cfg = preset_config(preset)
    out = []
    for op in OPS:
        facts = {**step_weight_shape(op, cfg), "head_dim": cfg.head_dim, "n_heads": cfg.n_heads,
                 "n_kv_heads": cfg.n_kv_heads}
        for kernel, v in default_variants(op, **facts).items():
            fmt = kernel.rsplit("_", 1)[-1]
            if fmt not in WEIGHT_BYTES:
                continue  # the split-KV attention kernel: no weights
            weights = rows_a_step(op, v.constexprs) * v.constexprs["BLOCK_K"] / (32 * v.num_warps)  # a thread, a step
            for arch in archs:
                ck = compile_variant(v, arch, budget_bytes=ORIN_SMEM_BUDGET)
                st = loop_stats(ck.cubin)
                out.append({"op": op, "kernel": kernel, "format": fmt, "arch": arch_name(arch), "variant": v.label(),
                            "loop_instructions": st.instructions, "instructions_per_weight": st.instructions / weights,
                            "instructions_per_weight_byte": st.instructions / (weights * WEIGHT_BYTES[fmt]),
                            "registers": ck.registers, "spills": ck.spills, "shared_bytes": ck.shared_bytes,
                            "loop_global_loads_by_bits": st.global_loads})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama-3.2-1b")
    ap.add_argument("--arch", default="87,90")
    ap.add_argument("--json")
    args = ap.parse_args()
    table = rows(args.preset, [int(a) for a in args.arch.split(",")])
    print(f"static (cross-compiled on the CPU, no GPU), {args.preset} shapes, default tiles")
    print(f"{'kernel':26} {'arch':5} {'instr/w':>7} {'instr/B':>7} {'loop':>5} {'regs':>4} {'spill':>5} {'smem':>6}  variant")
    for r in table:
        print(f"{r['kernel']:26} {r['arch']:5} {r['instructions_per_weight']:7.2f} {r['instructions_per_weight_byte']:7.2f} "
              f"{r['loop_instructions']:5} {r['registers'] or -1:4} {(r['spills'] or {}).get('stores', -1):5} "
              f"{r['shared_bytes']:6}  {r['variant']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"measured_on": "static: cross-compiled on the CPU (no GPU), SASS read with Triton's nvdisasm",
                       "preset": args.preset, "kernels": table}, f, indent=1)
    return 0 if all(r["shared_bytes"] <= ORIN_SMEM_BUDGET for r in table) else 1


if __name__ == "__main__":
    sys.exit(main())
