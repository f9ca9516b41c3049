#!/usr/bin/env bash
# One device call (<= ~330 s after setup) after a merge that touched the fused kernels and the serving stack:
#   1. (<= TESTS_S, 120) the fused operators' GPU tests, every weight format (FP64 oracle; INT4 draws bounded by
#      FUSED_INT4_EXAMPLES, 4) and the graphed fused step vs the per-operator step (fp16/int8/int4)
#   2. (<= BENCH_S, 110) decode tokens/s at llama-3.2-1b, int8 and int4 on the fused engine (random preset weights,
#      batch 1, depth 512; no llama.cpp rows): INT4 / INT8
#   3. the short serve bench (scripts/gpu_serve_bench.sh: serve vs run, 1 vs 8 clients, swaps under load on the fused
#      and on the persistent path, probation outcomes)
# Also stashes the default model's first GGUF half (.devcarry_a) as /tmp/parts/a for gpu_final.sh stage 2 when
# carried. Results under $OUT (i4/, sb/). Usage from the repo root on the GPU machine.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/i4"
[ -f .devcarry_a/part ] && mkdir -p /tmp/parts && cp .devcarry_a/part /tmp/parts/a
source scripts/gpu_setup.sh > "$OUT/setup.log" 2>&1 || { tail -5 "$OUT/setup.log"; exit 1; }
T0=$(date +%s)
( cd "$EDGEKIT_RUN_DIR" && FUSED_INT4_EXAMPLES=${FUSED_INT4_EXAMPLES:-4} timeout "${TESTS_S:-120}" python3 -m pytest -q -m gpu \
    "$R/tests/kernels/test_fused_gpu.py" "$R/tests/edgekit/runtime/test_fused_decode_gpu.py" -c "$R/pyproject.toml" \
    --rootdir "$R" -p no:cacheprovider -p no:randomly -rfE > "$OUT/i4/pytest_fused_gpu.log" 2>&1
  echo "fused GPU tests rc=$? at +$(( $(date +%s) - T0 )) s: $(tail -1 "$OUT/i4/pytest_fused_gpu.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/i4/pytest_fused_gpu.log" | head -10
  timeout "${BENCH_S:-110}" python3 "$R/scripts/bench_decode_vs_llamacpp.py" --workdir /tmp/w --json "$OUT/i4/bench_int4_fused.json" \
    --presets llama-3.2-1b --precisions int8,int4 --engines edgekit-fused --random-weights --depth 512 --tokens 64 \
    --repeats 2 > "$OUT/i4/bench_int4_fused.txt" 2> "$OUT/i4/bench_int4_fused_stderr.log"
  echo "decode bench rc=$? at +$(( $(date +%s) - T0 )) s"; tail -8 "$OUT/i4/bench_int4_fused.txt"
  grep "tok/s" "$OUT/i4/bench_int4_fused_stderr.log" | tail -4 )
SWAPS=${SWAPS:-10} SWAP_BUDGET=${SWAP_BUDGET:-20} PSWAPS=${PSWAPS:-10} PSWAP_BUDGET=${PSWAP_BUDGET:-40} BATCH1_S=${BATCH1_S:-3} \
  LOAD_S=${LOAD_S:-3} OUT=$OUT/sb bash scripts/gpu_serve_bench.sh > "$OUT/sb.txt" 2>&1
echo "serve bench at +$(( $(date +%s) - T0 )) s"; grep -v '^{' "$OUT/sb.txt" | tail -32
