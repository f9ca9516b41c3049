#!/usr/bin/env python3
"""Decode tokens/s of the fused path at each programmatic-dependent-launch level (kernels/pdl_triton.py), GPU only.

One process, one set of random preset weights per (model, precision); for each level EDGEKIT_PDL forces it and a
fresh graphed engine is captured (the level is read at every launch); batch 1, --context tokens of depth,
median of --repeats timed runs of --tokens greedy steps. Prints a table and JSON; says what it was measured on.

H200, 2026-12-01 (depth 512): llama-3.2-1b fp16 1107 / 1085 / 1064 tok/s at levels 0 / 1 / 2, int8 1439 / 1277 /
1305; smollm2-135m fp16 1764 at 0 vs 2296 at 2, int8 1773 vs 2017. A level that waited as 2 but let the next kernel
launch only at the programs' exit (no early trigger) gave 1067 (fp16) and 1446 (int8) at 1B and lost at 135m: not
kept. So at 1B no PDL variant pays; the auto rule (pdl_triton.auto_level) stands.
Level ``attn`` (PDL for the attention operators' launches only: the projection's weights fetched into L2 while the
attention runs) is measured beside them; the levels' runs are interleaved (one engine each, captured first).

    python3 tools/pdl_sweep.py preset:llama-3.2-1b --precisions fp16,int8 --levels 0,1,2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

from edgekit.bench.fused_engine import FusedRuntimeEngine
from edgekit.bench.measure import timed
from edgekit.bench.runner import _cast, _prompt, quantized
from edgekit.kernels.pdl_triton import ENV
from edgekit.model.presets import preset_config
from edgekit.model.weights import random_weights


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--precisions", default="fp16,int8")
    ap.add_argument("--levels", default="0,1,2,attn", help="comma list of EDGEKIT_PDL values (kernels/pdl_launch.py)")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    for spec in a.models:
        cfg = preset_config(spec)
        for prec in a.precisions.split(","):
            w = quantized(_cast(random_weights(cfg, seed=0, dtype=torch.float16), "cuda", torch.float16), prec)
            levels = a.levels.split(",")
            engines, secs = {}, {lv: [] for lv in levels}
            for level in levels:  # each level's engine captured with that level (read at every launch)
                os.environ[ENV] = level
                eng = FusedRuntimeEngine(cfg, w, a.context + a.tokens + 64, a.tokens)
                first = eng.prefill(_prompt(cfg, a.context, 0, "cuda"))
                eng.decode(first, a.context, a.tokens)  # warm
                engines[level] = (eng, first)
            for r in range(a.repeats):  # interleaved, the order rotated: a clock or neighbour drift hits all alike
                for level in levels[r % len(levels):] + levels[:r % len(levels)]:
                    eng, first = engines[level]
                    os.environ[ENV] = level
                    secs[level].append(timed(lambda: eng.decode(first, a.context, a.tokens), dev)[1])
            for level, (eng, _) in engines.items():
                tps = a.tokens / statistics.median(secs[level])
                rows.append({"model": spec, "precision": prec, "pdl_level": level, "decode_tokens_per_s": tps,
                             "runs_s": secs[level]})
                print(f"{spec:22} {prec:5} PDL {level:4}: {tps:8.1f} tok/s", flush=True)
                eng.close()
            del engines
            del w
            torch.cuda.empty_cache()
    os.environ.pop(ENV, None)
    doc = {"measured_on": f"GPU ({torch.cuda.get_device_name(dev)})", "batch": 1, "context": a.context, "rows": rows}
    print(json.dumps(doc))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
