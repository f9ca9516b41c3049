#!/usr/bin/env bash
# GPU machine, one call (<= 150 s with the defaults): the W4A16 GEMV benchmark (bench_w4a16.py --gemv-only:
# old = the default GEMV, new = the half2 GEMV (DECODE 3) at several tiles, against copy bandwidth, fp16 F.linear
# and W8A16, llama-3.2-1b's shapes and >= 32 MB ones) and the W4A16 GPU tests (FP64 oracle, DECODE 3 included).
# Bounded: each step has its own timeout. Run from the repo root (or a copy of it); results go to $OUT.
#   bash tools/gpu_w4a16.sh [bench_timeout_s=75] [tests_timeout_s=60] [bench options, default --gemv-only]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source tools/gpu_setup.sh > "$OUT/setup.log" 2>&1 || { tail -5 "$OUT/setup.log"; exit 1; }
cd "$EDGEKIT_RUN_DIR"   # outside the repo: ./edgekit must not shadow the mapped package
timeout "${1:-75}" python3 "$R/scripts/bench_w4a16.py" --json "$OUT/bench_w4a16.json" ${3:---gemv-only} 2>&1 | tee "$OUT/bench_w4a16.log"
W4A16_EXAMPLES=${W4A16_EXAMPLES:-10} timeout "${2:-60}" python3 -m pytest -q -m gpu "$R/tests/kernels/test_w4a16_gpu.py" \
  -c "$R/pyproject.toml" --rootdir "$R" -p no:cacheprovider -rfE 2>&1 | tail -40 > "$OUT/pytest_w4a16_gpu.log"
tail -15 "$OUT/pytest_w4a16_gpu.log"
