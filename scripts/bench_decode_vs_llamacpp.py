#!/usr/bin/env python3
"""Batch-1 decode of edgekit (per-operator and fused paths) against llama.cpp, on the same GGUF files (GPU).

For each preset: write a random-weight F16 GGUF of its shape (edgekit), make
llama.cpp's Q8_0 copy with llama-quantize, load the F16 file back with
edgekit's GGUF loader, and measure in one process:

- edgekit fp16, int8 (W8A16 blocks) and int4 (W4A16 blocks, on the fused path), made from the same F16 file, each on
  the graphed decode steps of ``--engines`` (default: the fused super-operators;
  ``edgekit`` adds the per-operator step): decode tokens/s
  at depth D (prefill D tokens, then N greedy tokens fed back on the device,
  median of R loops), graphed prefill time for D tokens (TTFT), kernels per
  token (torch.profiler), the bandwidth roofline (device copy bandwidth
  measured in the same run);
- agreement of the two paths on one step from the same cache: logits
  difference, argmax, the cache rows written;
- llama.cpp: ``llama-bench -p D -n N -d D -fa 1 -ngl 99`` on F16 and Q8_0.

Prints a table with ratios and writes JSON. All figures are measured on the
local GPU (random weights: speed does not depend on values).

  python scripts/bench_decode_vs_llamacpp.py --workdir /tmp/w --json out.json \
      [--llama-bench PATH --llama-quantize PATH --wait-llama-s 300]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edgekit.bench.decode_vs_llamacpp import DEFAULT_ENGINES, ENGINES, run, table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="smollm2-135m,llama-3.2-1b",
                    help="comma list; PRESET:fp16+int4 measures only those precisions of that preset")
    ap.add_argument("--precisions", default="fp16,int8")
    ap.add_argument("--engines", default=",".join(DEFAULT_ENGINES),
                    help=f"comma list of edgekit engines: {', '.join(ENGINES)} (edgekit = the per-operator step)")
    ap.add_argument("--depth", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--llama-bench", type=Path)
    ap.add_argument("--llama-quantize", type=Path)
    ap.add_argument("--wait-llama-s", type=float, default=0.0, help="wait this long for the llama.cpp binaries to appear")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--random-weights", action="store_true",
                    help="edgekit only: the presets' random weights made in memory (no GGUF file, no llama.cpp rows)")
    args = ap.parse_args()
    args.precisions = tuple(args.precisions.split(","))
    args.engines = tuple(args.engines.split(","))
    if not args.engines or any(e not in ENGINES for e in args.engines):
        ap.error(f"--engines {','.join(args.engines)}: expected a comma list of {', '.join(ENGINES)}")
    doc = run(args)
    print(table(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
