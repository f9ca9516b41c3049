#!/usr/bin/env bash
# Issue #13 on the GPU machine, in two calls (the default model's GGUF travels in two parts:
# .gpuwork/parts/a with the code in call 1, .devcarry_b/part in call 2 while the machine is still warm).
#   stage 1: llama.cpp build in the background (.llamacpp/llama.cpp.tar.xz, peers.md); the fused operators'
#            GPU property tests; a tile sweep of the fused GEMVs (scripts/fused_tile_sweep.py); the decode benchmark
#            (scripts/bench_decode_vs_llamacpp.py: edgekit per-operator + fused, fp16 + int8, vs llama.cpp)
#   stage 2: the default model (real weights): h200 bundle, run on the GPU (fused path), per-operator eager,
#            and the CPU reference; greedy tokens compared
# Results go to $OUT (JSON + logs). Usage (from the repo copy root): bash scripts/gpu_fused_decode.sh 1|2
set -uo pipefail
stage=${1:?stage 1 or 2}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source scripts/gpu_setup.sh || exit 1
cd "$EDGEKIT_RUN_DIR"   # outside the repo: ./edgekit must not shadow the mapped package
ek() { python3 -m edgekit "$@"; }
if [ "$stage" = 1 ]; then
  [ -f "$R/parts/a" ] && mkdir -p /tmp/parts && cp "$R/parts/a" /tmp/parts/a
  LC=/tmp/lc/llama.cpp
  if [ -f "$R/.llamacpp/llama.cpp.tar.xz" ]; then
    ( mkdir -p /tmp/lc && tar xJf "$R/.llamacpp/llama.cpp.tar.xz" -C /tmp/lc && cd $LC && \
      cmake -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/lc/cfg.log 2>&1 && \
      nice cmake --build build --target llama-bench llama-quantize -j 14 > /tmp/lc/build.log 2>&1; echo "llama.cpp build rc=$?" ) &
  fi
  timeout 120 python3 -m pytest -q "$R/tests/kernels/test_fused_gpu.py" -c "$R/pyproject.toml" --rootdir "$R" \
    -p no:cacheprovider -p no:randomly -rfE 2>&1 | tail -40 > "$OUT/pytest_fused_gpu.log"; tail -8 "$OUT/pytest_fused_gpu.log"
  timeout 140 python3 "$R/scripts/fused_tile_sweep.py" --json "$OUT/tile_sweep.json" --budget-s 120 > "$OUT/tile_sweep.txt" 2>&1
  tail -9 "$OUT/tile_sweep.txt"
  timeout 330 python3 "$R/scripts/bench_decode_vs_llamacpp.py" --workdir /tmp/w --json "$OUT/bench_decode.json" \
    --llama-bench $LC/build/bin/llama-bench --llama-quantize $LC/build/bin/llama-quantize --wait-llama-s 170 \
    2> "$OUT/bench_stderr.log"; echo "bench rc=$?"; tail -5 "$OUT/bench_stderr.log"
  tail -3 /tmp/lc/build.log 2>/dev/null
  exit 0
fi
cat /tmp/parts/a "$R/../.devcarry_b/part" > /tmp/model.gguf && sha256sum /tmp/model.gguf
M=/tmp/model.gguf
P="What is the capital of France?"
( time ek build $M --target h200 --dev-key -o /tmp/b-h200 --force --json > "$OUT/build_h200.json" ) 2>&1 | tail -3
ek run /tmp/b-h200 --allow-dev-key -p "$P" -n 32 --json > "$OUT/run_h200_fused.json"; echo "run gpu (golden checked) rc=$?"
ek run /tmp/b-h200 --allow-dev-key --skip-golden -p "$P" -n 32 --json --no-cuda-graphs > "$OUT/run_h200_eager.json"; echo "run gpu eager rc=$?"
ek run /tmp/b-h200 --allow-dev-key --skip-golden -p "$P" -n 32 --json --device cpu > "$OUT/run_h200_cpu.json"; echo "run cpu rc=$?"
python3 - "$OUT" <<'PY'
import json, sys
o = sys.argv[1]
g, e, c = (json.load(open(f"{o}/{n}.json")) for n in ("run_h200_fused", "run_h200_eager", "run_h200_cpu"))
print("decode path:", g["decode_path"])
for name, d in (("gpu fused graph", g), ("gpu per-op eager", e), ("cpu reference", c)):
    print(f"{name:17}: {d['text'][:70]!r} {d['stats']['decode_tokens_per_s']:.0f} tok/s")
for name, d in (("fused", g), ("eager", e)):
    n = min(len(d["token_ids"]), len(c["token_ids"]))
    same = sum(a == b for a, b in zip(d["token_ids"], c["token_ids"]))
    print(f"greedy tokens gpu {name} vs cpu reference: {same}/{n} identical")
PY
