#!/usr/bin/env python3
"""Time candidate tiles of the fused decode's split-KV attention (attn_split_combine) at a preset's shape, GPU only.

The operator (fused_attn_proj_residual: the attention kernel, whose last split of each KV head merges the splits,
then the o-projection + residual GEMV) runs as the decode step runs it: batch 1, one new token at --depth keys in a
cache of --depth + 128 rows, one cache and o-projection weight per layer (the preset's layer count, so the working
set is the decode step's), replayed as one CUDA graph (scripts/bench_kernels.py: graph_time_us). Only the
attention kernel's tile changes; the o-projection keeps its default. Each candidate is first checked against the
FP64 oracle (tests/kernels/fused_cases.py: check_case, ratio <= 1) at the same head shape: a wrong tile is reported,
not timed. Prints a table and JSON (--json); measured on the GPU named in the output.

    python3 tools/attn_tile_sweep.py preset:llama-3.2-1b --json attn.json

H200, 2026-12-02, llama-3.2-1b, depth 512 (22 candidates, all within the FP64 tolerance): the default (BLOCK_N 128,
4 warps, 3 stages) 10.04 us a layer for attention + o-projection, the best candidate 9.99 (BLOCK_N 64, MAX_SPLITS
32, 2 warps, 3 stages), the slowest 12.13: the tile is not what bounds it. The attention is a chain of dependent
latencies (sequence length, keys, values, partials, the arrival counter, the merge), not bandwidth (1 MB of keys
and values a layer). Inside the whole graphed step the tile does matter (tools/step_ab.py, H100, 2026-12-05:
qwen3-1.7b 128-key blocks +1.9% to +4.2% over 64, gemma-3-1b 64 over 32 +7.2%): time a tile there before adopting
or rejecting it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

from bench_kernels import graph_time_us
from edgekit.kernels.triton_backend import TritonOp, gpu_tile_facts
from edgekit.kernels.variants import default_variants
from edgekit.model.presets import preset_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))
from fused_cases import check_case  # noqa: E402

OP = "fused_attn_proj_residual"
SPLIT = "attn_split_combine"


def candidates(base):
    """The default split tile, then shorter key blocks (more splits: BLOCK_N 32 / 64 x MAX_SPLITS 16 / 32, 2 or 4
    warps, 1 or 3 stages) and the default's BLOCK_N 128 at 2 / 4 warps and 1-3 stages (its split count is bound
    by the cache's blocks, so MAX_SPLITS changes nothing there)."""
    grid = [(bn, ms, w, st) for bn in (32, 64) for ms in (16, 32) for w in (2, 4) for st in (1, 3)]
    grid += [(128, base.constexprs["MAX_SPLITS"], w, st) for w in (2, 4) for st in (1, 2, 3)]
    out = [base]
    for bn, ms, warps, stages in grid:
        v = dataclasses.replace(base, constexprs={**base.constexprs, "BLOCK_N": bn, "MAX_SPLITS": ms},
                                num_warps=warps, num_stages=stages)
        if v != base:
            out.append(v)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default="preset:llama-3.2-1b")
    ap.add_argument("--depth", type=int, default=512)
    ap.add_argument("--json")
    a = ap.parse_args()
    cfg = preset_config(a.model)
    dev, h = torch.device("cuda"), torch.float16
    B, Hq, Hkv, D, C = 1, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.hidden_size
    S = a.depth + 128
    facts = {"head_dim": D, "n_heads": Hq, "n_kv_heads": Hkv, "n_out": C, "k_in": Hq * D,
             **gpu_tile_facts(dev)}  # the default the JIT path runs on this GPU
    dflt = default_variants(OP, **facts)
    proj = dflt["attn_o_proj_residual_fp"]
    layers = []
    for _ in range(cfg.n_layers):
        layers.append((torch.randn(B, Hq, D, device=dev, dtype=h), torch.randn(B, Hkv, S, D, device=dev, dtype=h),
                       torch.randn(B, Hkv, S, D, device=dev, dtype=h),
                       torch.full((B,), a.depth + 1, device=dev, dtype=torch.int32),
                       torch.zeros(B, Hkv, device=dev, dtype=torch.int32),
                       torch.randn(C, Hq * D, device=dev, dtype=h) / (Hq * D) ** 0.5,
                       torch.randn(B, C, device=dev, dtype=h)))
    rows = []
    for v in candidates(dflt[SPLIT]):
        fn = TritonOp(OP, {SPLIT: v, proj.kernel: proj})
        row = {"variant": v.label(), "default": v == dflt[SPLIT]}
        try:
            ratios = check_case(OP, fn, B=1, C=64, int8=False, bias=False, seed=0, n_heads=Hq, n_kv_heads=Hkv,
                                head_dim=D, N=C, S=S, min_seq_len=a.depth)
            if not all(r <= 1.0 for r in ratios.values()):
                raise ValueError(f"outside the FP16 tolerance against the FP64 oracle: {ratios}")
            us = graph_time_us([lambda L=L: fn(L[0], L[1], L[2], L[3], L[4], L[5], None, None, None, L[6], D ** -0.5)
                                for L in layers])
        except Exception as e:  # noqa: BLE001 - a tile that does not compile, launch or match is recorded
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
            print(f"  skip {v.label()}: {row['error']}", flush=True)
            continue
        row["us_per_layer"] = us
        rows.append(row)
        print(f"{us:7.2f} us/layer  {'*' if row['default'] else ' '} {v.label()}", flush=True)
    timed = [r for r in rows if "us_per_layer" in r]
    best = min(timed, key=lambda r: r["us_per_layer"])
    d = next(r for r in timed if r["default"])
    print(f"{a.model} depth {a.depth}: default {d['us_per_layer']:.2f} us/layer (attention + o-proj), best "
          f"{best['us_per_layer']:.2f} {best['variant']}")
    doc = {"measured_on": f"GPU ({torch.cuda.get_device_name(dev)})", "model": a.model, "depth": a.depth,
           "cache_rows": S, "o_proj_variant": proj.label(), "rows": rows}
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
