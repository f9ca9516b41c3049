#!/usr/bin/env bash
# GPU machine, one call (<= 300 s after setup): issue 14's INT4 (W4A16) variants of the fused decode operators.
#   1. (<= ${1:-130} s) the GPU tests of the INT4 fused kernels: the four layer operators against the FP64 oracle
#      (tests/kernels/test_fused_gpu.py::test_fused_int4_operator_matches_fp64, FUSED_INT4_EXAMPLES hypothesis
#      examples each: group 32/64/128, symmetric or offsets, FP16/FP32 scales, PDL on and off) and the graphed INT4
#      fused step against the per-operator step (tests/edgekit/runtime/test_fused_decode_gpu.py, batch 1 and 4);
#   2. (<= ${2:-160} s) the decode benchmark rows --precisions int8,int4 --engines edgekit-fused at llama-3.2-1b
#      (random preset weights made in memory, batch 1, depth 512; no llama.cpp rows), then INT4 / INT8 tokens/s
#      (goal: >= 1.6) and the decode path each row ran.
# The sm_87 / sm_90 AOT builds (128 KB, no spills) are checked on the CPU machine (tests/kernels/test_fused_aot.py).
# Results (logs, JSON) go to $OUT. Usage (from the repo root on the GPU machine):
#   bash scripts/gpu_int4_fused.sh [tests_timeout_s=130] [bench_timeout_s=160]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source scripts/gpu_setup.sh > "$OUT/setup.log" 2>&1 || { tail -5 "$OUT/setup.log"; exit 1; }
cd "$EDGEKIT_RUN_DIR"   # outside the repo: ./edgekit must not shadow the mapped package
T0=$(date +%s)
FUSED_INT4_EXAMPLES=${FUSED_INT4_EXAMPLES:-6} timeout "${1:-130}" python3 -m pytest -q -m gpu -k int4 \
  "$R/tests/kernels/test_fused_gpu.py" "$R/tests/edgekit/runtime/test_fused_decode_gpu.py" \
  -c "$R/pyproject.toml" --rootdir "$R" -p no:cacheprovider -p no:randomly -rfE > "$OUT/pytest_int4_fused_gpu.log" 2>&1
echo "int4 fused GPU tests rc=$? at +$(( $(date +%s) - T0 )) s: $(tail -1 "$OUT/pytest_int4_fused_gpu.log")"
grep -E "^(FAILED|ERROR)" "$OUT/pytest_int4_fused_gpu.log" | head -10
timeout "${2:-160}" python3 "$R/scripts/bench_decode_vs_llamacpp.py" --workdir /tmp/w --json "$OUT/bench_int4_fused.json" \
  --presets llama-3.2-1b --precisions int8,int4 --engines edgekit-fused --random-weights --depth 512 --tokens 64 \
  --repeats 2 > "$OUT/bench_int4_fused.txt" 2> "$OUT/bench_int4_fused_stderr.log"
echo "decode bench rc=$? at +$(( $(date +%s) - T0 )) s"; cat "$OUT/bench_int4_fused.txt"  # the table ends with int4 / int8
grep "tok/s" "$OUT/bench_int4_fused_stderr.log"  # per row as measured (there even if the table was cut off)
exit 0
