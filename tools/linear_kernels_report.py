#!/usr/bin/env python3
"""Cross-compile the linear operators' default kernels (no GPU needed) for sm_87 (Orin) and sm_90 (H200): shared
memory, registers and spills per variant, at the decode (1 row) and prefill (512 rows) shapes the planner tiles.
The per-operator counterpart of fused_kernels_report.py. JSON + table; exit 1 if a kernel needs more than 128 KB
of shared memory or spills.

  python tools/linear_kernels_report.py [--ops linear_w4a16,linear_w8a16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys

from edgekit.kernels.aot import compile_variant
from edgekit.kernels.arch import arch_name
from edgekit.kernels.variants import default_variants

ORIN_SMEM_BUDGET = 128 * 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default="linear_w4a16,linear_w8a16,linear")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows, seen = [], set()
    for op in args.ops.split(","):
        for tokens in (1, 512):
            for v in default_variants(op, rows=tokens).values():
                if v in seen:
                    continue
                seen.add(v)
                for arch in (87, 90):
                    ck = compile_variant(v, arch, budget_bytes=ORIN_SMEM_BUDGET)
                    rows.append({"op": op, "rows": tokens, "variant": v.label(), "arch": arch_name(arch),
                                 "shared_bytes": ck.shared_bytes, "registers": ck.registers, "spills": ck.spills,
                                 "fits_128kb": ck.shared_bytes <= ORIN_SMEM_BUDGET})
    print(f"{'op':14} {'rows':>4} {'arch':5} {'smem':>6} {'regs':>4} {'spill st/ld':>11}  variant")
    for r in rows:
        sp = r["spills"] or {}
        print(f"{r['op']:14} {r['rows']:4} {r['arch']:5} {r['shared_bytes']:6} {r['registers'] or -1:4} "
              f"{sp.get('stores', -1):5}/{sp.get('loads', -1):<5}  {r['variant']}")
    doc = {"measured_on": "cross-compiled on the CPU (no GPU): Triton metadata + bundled ptxas -v", "kernels": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0 if all(r["fits_128kb"] and (r["spills"] or {}).get("stores", 0) == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
