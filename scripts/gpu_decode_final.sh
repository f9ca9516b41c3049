#!/usr/bin/env bash
# Issue #13 final measurement on the GPU machine, one call (<= 560 s):
#   - llama.cpp built in the background from .llamacpp/llama.cpp.tar.xz (peers.md), when present;
#   - GPU property tests of the fused operators and the persistent decode kernel (FP64 oracle, persistent launch
#     equal to its staged launches and to the fused operators bit for bit), and the graphed runtime paths;
#   - the decode benchmark (scripts/bench_decode_vs_llamacpp.py): edgekit fused AND persistent rows, fp16 + int8,
#     smollm2-135m + llama-3.2-1b, depth 512, copy bandwidth of the same run, llama.cpp F16 / Q8_0 on the same
#     GGUF files once its build is there.
# Results (JSON + logs) go to $OUT. Knobs (environment): LLAMA=0 skips llama.cpp; TESTS=0 skips the tests;
# BENCH_ARGS adds arguments to the bench (e.g. "--tokens 64 --repeats 2"); EXTRA runs one more command at the end.
# Usage (from the repo copy root): bash scripts/gpu_decode_final.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source scripts/gpu_setup.sh > "$OUT/setup.log" 2>&1 || { tail -5 "$OUT/setup.log"; exit 1; }
cd "$EDGEKIT_RUN_DIR"   # outside the repo: ./edgekit must not shadow the mapped package
t0=$(date +%s)
LC=/tmp/lc/llama.cpp
if [ "${LLAMA:-1}" = 1 ] && [ -f "$R/.llamacpp/llama.cpp.tar.xz" ]; then
  ( mkdir -p /tmp/lc && tar xJf "$R/.llamacpp/llama.cpp.tar.xz" -C /tmp/lc && cd $LC && \
    cmake -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/lc/cfg.log 2>&1 && \
    nice cmake --build build --target llama-bench llama-quantize -j 14 > /tmp/lc/build.log 2>&1; echo "llama.cpp build rc=$?" ) &
  LLAMA_ARGS="--llama-bench $LC/build/bin/llama-bench --llama-quantize $LC/build/bin/llama-quantize --wait-llama-s 200"
else
  LLAMA_ARGS="--random-weights"
fi
pt() { timeout "$1" python3 -m pytest -q "${@:2}" -c "$R/pyproject.toml" --rootdir "$R" -p no:cacheprovider -p no:randomly -rfE; }
if [ "${TESTS:-1}" = 1 ]; then
  pt 170 "$R/tests/kernels/test_persistent_gpu.py" "$R/tests/kernels/test_fused_gpu.py" > "$OUT/pytest_kernels_gpu.log" 2>&1
  echo "kernel tests: $(tail -1 "$OUT/pytest_kernels_gpu.log")"
  pt 90 "$R/tests/edgekit/runtime/test_fused_decode_gpu.py" > "$OUT/pytest_runtime_gpu.log" 2>&1
  echo "runtime tests: $(tail -1 "$OUT/pytest_runtime_gpu.log")"
fi
echo "tests done at +$(( $(date +%s) - t0 )) s"
timeout $(( 540 - ($(date +%s) - t0) )) python3 "$R/scripts/bench_decode_vs_llamacpp.py" --workdir /tmp/w \
  --json "$OUT/bench_decode.json" $LLAMA_ARGS ${BENCH_ARGS:-} 2> "$OUT/bench_stderr.log"
echo "bench rc=$? at +$(( $(date +%s) - t0 )) s"; tail -4 "$OUT/bench_stderr.log"
tail -2 /tmp/lc/build.log 2>/dev/null
if [ -n "${EXTRA:-}" ]; then eval "$EXTRA"; fi
exit 0
