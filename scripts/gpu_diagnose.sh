#!/usr/bin/env bash
# One device call of diagnostics for issue #13 (each part bounded; results under $OUT):
#   1. serve's persistent runner vs the fused one, and the one-factor-at-a-time table that names the cause of
#      non-finite logits (tests/edgekit/runtime/test_serve_persistent_gpu.py)
#   2. the persistent layer's FP64 property test and barrier test (tests/kernels/test_persistent_gpu.py)
#   3. per-kernel profile of the decode step at llama-3.2-1b, fp16 and int8 (scripts/profile_decode.py; ENGINE:
#      fused by default, per-operator or persistent)
#   4. the persistent path under serve (scripts/gpu_diagnose_serve.sh SET=5: over HTTP, then the short serve bench
#      with swaps while the persistent kernel is active)
#   5. the fused GEMVs' tile sweep at llama-3.2-1b (scripts/fused_tile_sweep.py, SWEEP_S seconds)
# PARTS (default "1 2 3") picks parts. Usage from the repo root on the GPU machine: bash scripts/gpu_diagnose.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PARTS=${PARTS:-1 2 3}
source scripts/gpu_setup.sh > "$OUT/setup.log" 2>&1 || { tail -5 "$OUT/setup.log"; exit 1; }
cd "$EDGEKIT_RUN_DIR"
pt() { timeout "$1" python3 -m pytest -q -m gpu "${@:2}" -c "$R/pyproject.toml" --rootdir "$R" -p no:cacheprovider \
         -p no:randomly -rA; }
for p in $PARTS; do
  T=$(date +%s)
  case $p in
    1) pt 240 "$R/tests/edgekit/runtime/test_serve_persistent_gpu.py" > "$OUT/serve_persistent.log" 2>&1
       echo "part 1 rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/serve_persistent.log" | tail -30 ;;
    2) pt 200 "$R/tests/kernels/test_persistent_gpu.py" > "$OUT/persistent_fp64.log" 2>&1
       echo "part 2 rc=$?"; tail -3 "$OUT/persistent_fp64.log" ;;
    3) for prec in fp16 int8; do
         timeout 120 python3 "$R/scripts/profile_decode.py" preset:llama-3.2-1b --precision $prec --engine ${ENGINE:-fused} \
           --json "$OUT/profile_1b_$prec.json" > "$OUT/profile_1b_$prec.txt" 2>&1
         echo "part 3 $prec rc=$?"; cat "$OUT/profile_1b_$prec.txt" | tail -20
       done ;;
    5) timeout 100 python3 "$R/scripts/fused_tile_sweep.py" --presets llama-3.2-1b --budget-s ${SWEEP_S:-70} \
         --json "$OUT/tile_sweep_1b.json" > "$OUT/tile_sweep_1b.txt" 2>&1; echo "part 5 rc=$?"; tail -10 "$OUT/tile_sweep_1b.txt" ;;
    4) (cd "$R" && SET=5 OUT=$OUT/serve bash scripts/gpu_diagnose_serve.sh > "$OUT/serve_diag.txt" 2>&1)
       tail -32 "$OUT/serve_diag.txt" | cut -c1-600 ;;
  esac
  echo "part $p took $(( $(date +%s) - T )) s"
done
