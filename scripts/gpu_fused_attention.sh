#!/usr/bin/env bash
# One device call (<= ~240 s after setup): checks and times fused_attn_proj_residual's split-KV attention that merges
# its own splits (an arrival counter per (sequence, KV head)) and the plain o-projection GEMV after it.
#   1. (<= TESTS_S, 150) the fused operators' GPU tests (FP64 oracle, every weight format; the counters' ordering is
#      exercised only here: the CPU interpreter runs programs one after another), the graphed fused step vs the
#      per-operator step, and the persistent kernel's GPU tests (its stage 3 shares the combine code)
#   2. (<= PROFILE_S, 80 each) per-kernel times of the fused step at llama-3.2-1b, fp16 and int8 (random preset
#      weights, batch 1, depth 512; scripts/profile_decode.py)
# Results under $OUT (fa/). Usage from the repo root on the GPU machine.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/fa"
source scripts/gpu_setup.sh > "$OUT/setup.log" 2>&1 || { tail -5 "$OUT/setup.log"; exit 1; }
T0=$(date +%s)
cd "$EDGEKIT_RUN_DIR"   # outside the repo: ./edgekit must not shadow the mapped package
FUSED_INT4_EXAMPLES=${FUSED_INT4_EXAMPLES:-4} timeout "${TESTS_S:-150}" python3 -m pytest -q -m gpu \
  "$R/tests/kernels/test_fused_gpu.py" "$R/tests/edgekit/runtime/test_fused_decode_gpu.py" \
  "$R/tests/kernels/test_persistent_gpu.py" -c "$R/pyproject.toml" --rootdir "$R" -p no:cacheprovider -p no:randomly \
  -rfE > "$OUT/fa/pytest_gpu.log" 2>&1
echo "GPU tests rc=$? at +$(( $(date +%s) - T0 )) s: $(tail -1 "$OUT/fa/pytest_gpu.log")"
grep -E "^(FAILED|ERROR)" "$OUT/fa/pytest_gpu.log" | head -10
for p in ${PRECISIONS:-fp16 int8}; do
  timeout "${PROFILE_S:-80}" python3 "$R/scripts/profile_decode.py" preset:llama-3.2-1b --precision "$p" --engine fused \
    --json "$OUT/fa/profile_1b_$p.json" > "$OUT/fa/profile_1b_$p.txt" 2>&1
  echo "profile $p rc=$? at +$(( $(date +%s) - T0 )) s"; grep -A12 "ms/token" "$OUT/fa/profile_1b_$p.txt" | head -14
done
