#!/usr/bin/env python3
"""Cross-compile the fused decode kernels (no GPU needed) at the presets' shapes for sm_87 (Orin) and sm_90 (H200):
shared memory, registers and spills per kernel variant, from Triton and the ptxas bundled with it. JSON + table.

  python tools/fused_kernels_report.py [--presets smollm2-135m,llama-3.2-1b] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys

from edgekit.kernels.aot import compile_variant
from edgekit.kernels.arch import arch_name
from edgekit.kernels.variants import default_variants
from edgekit.model.presets import preset_config

ORIN_SMEM_BUDGET = 128 * 1024


def shapes(cfg) -> list[tuple[str, str, dict]]:
    qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
    return [("fused_norm_qkv_rope", "wqkv", {"n_out": qkv, "k_in": cfg.hidden_size, "head_dim": cfg.head_dim}),
            ("fused_attn_proj_residual", "wo", {"n_out": cfg.hidden_size, "k_in": cfg.q_size, "head_dim": cfg.head_dim,
                                                "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads}),
            ("fused_norm_swiglu", "w_gate_up", {"n_out": 2 * cfg.intermediate_size, "k_in": cfg.hidden_size}),
            ("fused_proj_residual", "w_down", {"n_out": cfg.hidden_size, "k_in": cfg.intermediate_size}),
            ("fused_head_argmax", "lm_head", {"n_out": cfg.vocab_size, "k_in": cfg.hidden_size})]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="smollm2-135m,llama-3.2-1b")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for preset in args.presets.split(","):
        cfg = preset_config(preset)
        for op, where, facts in shapes(cfg):
            for kernel, v in default_variants(op, **facts).items():
                for arch in (87, 90):
                    ck = compile_variant(v, arch, budget_bytes=ORIN_SMEM_BUDGET)
                    rows.append({"preset": preset, "weight": where, "op": op, "variant": v.label(), "arch": arch_name(arch),
                                 "shared_bytes": ck.shared_bytes, "registers": ck.registers, "spills": ck.spills,
                                 "fits_128kb": ck.shared_bytes <= ORIN_SMEM_BUDGET})
    print(f"{'preset':13} {'weight':9} {'arch':5} {'smem':>6} {'regs':>4} {'spill st/ld':>11}  variant")
    for r in rows:
        sp = r["spills"] or {}
        print(f"{r['preset']:13} {r['weight']:9} {r['arch']:5} {r['shared_bytes']:6} {r['registers'] or -1:4} "
              f"{sp.get('stores', -1):5}/{sp.get('loads', -1):<5}  {r['variant']}")
    doc = {"measured_on": "cross-compiled on the CPU (no GPU): Triton metadata + bundled ptxas -v", "kernels": rows}
    if args.json:
        open(args.json, "w").write(json.dumps(doc, indent=1))
    return 0 if all(r["fits_128kb"] and (r["spills"] or {}).get("stores", 0) == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
