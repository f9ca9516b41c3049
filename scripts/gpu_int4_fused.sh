#!/usr/bin/env bash
# GPU machine, one call (<= 200 s after setup): issue 14's INT4 (W4A16) fused decode with the half2 decode (DECODE 3
# of kernels/int4_half2_triton.py inside the fused GEMVs, FP16 activations).
#   1. (<= ${1:-60} s) the GPU tests of the INT4 fused kernels: the four layer operators against the FP64 oracle
#      (tests/kernels/test_fused_gpu.py -k int4: FUSED_INT4_EXAMPLES hypothesis examples each, group 32/64/128,
#      symmetric or offsets, FP16/FP32 scales, PDL on and off; FUSED_INT4_RANGE_EXAMPLES more with FP16 activations
#      up to 8000, the half2 range, in the inline PTX) and the graphed INT4 fused step against the per-operator step
#      (tests/edgekit/runtime/test_fused_decode_gpu.py -k int4, batch 1 and 4);
#   2. (<= ${2:-80} s) the decode benchmark rows --precisions int8,int4 --engines edgekit-fused at llama-3.2-1b (random
#      preset weights, batch 1, depth 512, 64 tokens, 2 repeats; no llama.cpp rows), then INT4 / INT8 tokens/s
#      (goal: >= 1.6); it compiles the 1B kernels first, so the profiles below find them in Triton's cache;
#   3. (<= ${3:-30} s each) the per-kernel profile of the fused decode step at llama-3.2-1b, int4 then int8 (scripts/
#      profile_decode.py --engine fused: random preset weights, batch 1, depth 512, 32 steps; the INT4 gate/up and
#      down GEMVs against INT8's).
# The sm_87 / sm_90 AOT builds (128 KB, no spills) and the static SASS counts are checked on the CPU machine
# (tests/kernels/test_fused_aot.py, scripts/fused_sass_report.py). Results (logs, JSON) go to $OUT; a summary is
# printed. Usage (from the repo root on the GPU machine):
#   bash scripts/gpu_int4_fused.sh [tests_timeout_s=60] [bench_timeout_s=80] [profile_timeout_s=30]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source scripts/gpu_setup.sh > "$OUT/setup.log" 2>&1 || { tail -5 "$OUT/setup.log"; exit 1; }
cd "$EDGEKIT_RUN_DIR"   # outside the repo: ./edgekit must not shadow the mapped package
T0=$(date +%s)
FUSED_INT4_EXAMPLES=${FUSED_INT4_EXAMPLES:-4} FUSED_INT4_RANGE_EXAMPLES=${FUSED_INT4_RANGE_EXAMPLES:-3} \
  timeout "${1:-60}" python3 -m pytest -q -m gpu -k int4 \
  "$R/tests/kernels/test_fused_gpu.py" "$R/tests/edgekit/runtime/test_fused_decode_gpu.py" \
  -c "$R/pyproject.toml" --rootdir "$R" -p no:cacheprovider -p no:randomly -rfE > "$OUT/pytest_int4_fused_gpu.log" 2>&1
echo "int4 fused GPU tests rc=$? at +$(( $(date +%s) - T0 )) s: $(tail -1 "$OUT/pytest_int4_fused_gpu.log")"
grep -E "^(FAILED|ERROR)" "$OUT/pytest_int4_fused_gpu.log" | head -10
timeout "${2:-80}" python3 "$R/scripts/bench_decode_vs_llamacpp.py" --workdir /tmp/w --json "$OUT/bench_int4_fused.json" \
  --presets llama-3.2-1b --precisions int8,int4 --engines edgekit-fused --random-weights --depth 512 --tokens 64 \
  --repeats 2 > "$OUT/bench_int4_fused.txt" 2> "$OUT/bench_int4_fused_stderr.log"
echo "decode bench rc=$? at +$(( $(date +%s) - T0 )) s"; cat "$OUT/bench_int4_fused.txt"  # the table ends with int4 / int8
grep "tok/s" "$OUT/bench_int4_fused_stderr.log"  # per row as measured (there even if the table was cut off)
for prec in int4 int8; do
  timeout "${3:-30}" python3 "$R/scripts/profile_decode.py" preset:llama-3.2-1b --precision $prec --engine fused \
    --json "$OUT/profile_fused_1b_$prec.json" > "$OUT/profile_fused_1b_$prec.txt" 2> "$OUT/profile_fused_1b_$prec.err"
  echo "profile $prec rc=$? at +$(( $(date +%s) - T0 )) s"; grep -A8 "ms/token" "$OUT/profile_fused_1b_$prec.txt"
done
exit 0
