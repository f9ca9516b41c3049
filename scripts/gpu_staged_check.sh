#!/usr/bin/env bash
# One device call (<= ~9 min with every step; 2026-12-02 it took 254 s): the K loops staged through shared memory
# (KernelDef.loop_stages) on the GPU.
#   1. (<= TESTS_S, 170) the fused operators' and the W4A16 GEMV's GPU tests (FP64 oracle; staged tiles included)
#   2. (<= W4_S, 150) scripts/bench_w4a16.py --gemv-only: the W4A16 GEMV's tiles, staged ones included, against fp16
#      F.linear and the copy bandwidth, same run
#   3. (<= AB_S, 100 each) decode tokens/s, llama-3.2-1b fp16 / int8 / int4, this working tree and BASE's (default
#      HEAD: run it with the change uncommitted, or name the commit before it) in the same call (scripts/pdl_sweep.py,
#      level 0). The device's copy of the checkout carries .git, so BASE is archived there.
# Narrower runs: TESTS_K (a pytest -k expression), W4_S=0 (no GEMV benchmark), LEVELS (this tree's PDL levels, e.g.
# 0,1,2), AB=0 (no BASE tree).
# Results under $OUT/st. Usage from the repo root on the GPU machine.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/st"
ROOT=$(pwd)
if [ "${AB:-1}" != 0 ]; then
  rm -rf .gpu-old && mkdir .gpu-old && git archive "${BASE:-HEAD}" | tar -x -C .gpu-old \
    || { echo "cannot archive ${BASE:-HEAD} (no .git here?): run with AB=0"; exit 1; }
fi
source scripts/gpu_setup.sh > "$OUT/setup.log" 2>&1 || { tail -5 "$OUT/setup.log"; exit 1; }
T0=$(date +%s)
cd "$EDGEKIT_RUN_DIR"
FUSED_INT4_EXAMPLES=${FUSED_INT4_EXAMPLES:-4} timeout "${TESTS_S:-170}" python3 -m pytest -q -m gpu \
  "$R/tests/kernels/test_fused_gpu.py" "$R/tests/kernels/test_w4a16_gpu.py" -c "$R/pyproject.toml" --rootdir "$R" \
  -p no:cacheprovider -p no:randomly -rfE ${TESTS_K:+-k "$TESTS_K"} > "$OUT/st/pytest_gpu.log" 2>&1
echo "GPU tests rc=$? at +$(( $(date +%s) - T0 )) s: $(tail -1 "$OUT/st/pytest_gpu.log")"
grep -E "^(FAILED|ERROR)" "$OUT/st/pytest_gpu.log" | head -10
if [ "${W4_S:-150}" != 0 ]; then
  (cd "$R/scripts" && timeout "${W4_S:-150}" python3 bench_w4a16.py --gemv-only --json "$OUT/st/w4a16.json" 2>&1 \
    | grep -E "^gemv" > "$OUT/st/w4a16.txt")
  echo "bench_w4a16 at +$(( $(date +%s) - T0 )) s"; cat "$OUT/st/w4a16.txt"
fi
timeout "${AB_S:-100}" python3 "$R/scripts/pdl_sweep.py" preset:llama-3.2-1b --precisions fp16,int8,int4 \
  --levels "${LEVELS:-0}" --repeats 7 --json "$OUT/st/pdl_new.json" 2>&1 | grep "tok/s"
echo "working tree at +$(( $(date +%s) - T0 )) s"
[ "${AB:-1}" = 0 ] && exit 0
cd "$ROOT/.gpu-old" && ln -sfn ../.whl .whl && source scripts/gpu_setup.sh > "$OUT/setup_old.log" 2>&1 \
  || { tail -5 "$OUT/setup_old.log"; echo "the ${BASE:-HEAD} tree did not set up: no A/B"; exit 1; }
cd "$EDGEKIT_RUN_DIR"
timeout "${AB_S:-100}" python3 "$R/scripts/pdl_sweep.py" preset:llama-3.2-1b --precisions fp16,int8,int4 --levels 0 \
  --repeats 7 --json "$OUT/st/pdl_old.json" 2>&1 | grep "tok/s"
echo "${BASE:-HEAD} tree at +$(( $(date +%s) - T0 )) s"
