#!/usr/bin/env bash
# One device call: scripts/pdl_sweep.py at llama-3.2-1b (fp16, int8; PDL levels 0-2) and smollm2-135m (levels 0
# and 2), batch 1, depth 512. Results: $OUT/pdl_sweep_*.json. Usage from the repo root on the GPU machine.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source scripts/gpu_setup.sh > "$OUT/setup_pdl.log" 2>&1 || { tail -5 "$OUT/setup_pdl.log"; exit 1; }
cd "$EDGEKIT_RUN_DIR"
timeout 200 python3 "$R/scripts/pdl_sweep.py" preset:llama-3.2-1b --precisions fp16,int8 --levels ${LEVELS_1B:-0,1,2} \
  --json "$OUT/pdl_sweep_1b.json" 2>&1 | grep -v '^{'
timeout 120 python3 "$R/scripts/pdl_sweep.py" preset:smollm2-135m --precisions fp16,int8 --levels ${LEVELS_135M:-0,2} \
  --json "$OUT/pdl_sweep_135m.json" 2>&1 | grep -v '^{'
