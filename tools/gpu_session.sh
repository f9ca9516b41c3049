#!/usr/bin/env bash
# One session's GPU measurements on the H200, each stage one bounded device call (results as JSON + logs in $OUT).
#   bash tools/gpu_session.sh bench PRESETS PRECISIONS   decode vs llama.cpp on the same GGUF files (batch 1, depth 512,
#        copy bandwidth of the same run), llama.cpp built from .llamacpp/llama.cpp.tar.xz (peers.md) in the
#        background on the first call and kept for the next call while the machine stays warm
#   bash tools/gpu_session.sh long                     tools/long_context_check.py: llama-3.2-1b INT8 at depth 4096
#   bash tools/gpu_session.sh ptx PRESETS              `edgekit build --target orin` of each preset (CPU cross-compile)
#        and `edgekit verify` of it on the GPU: golden vectors through the sm_87 PTX, JIT-compiled for this GPU
# Carry .whl (the wheels the GPU machine lacks) and, for bench, .llamacpp. Budget: each stage ends by LIMIT_S.
set -uo pipefail
stage=${1:?stage: bench, long or ptx}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s)
LIMIT_S=${LIMIT_S:-570}
left() { echo $(( LIMIT_S - ($(date +%s) - T0) )); }
source tools/gpu_setup.sh > "$OUT/setup_$stage.log" 2>&1 || { tail -5 "$OUT/setup_$stage.log"; exit 1; }
cd "$EDGEKIT_RUN_DIR"   # outside the repo: ./edgekit must not shadow the mapped package
LC=/tmp/lc/llama.cpp
case "$stage" in
bench)
  presets=${2:?presets}; precisions=${3:-fp16,int8,int4}
  if [ ! -e /tmp/lc/ready/llama-bench ] && [ ! -d "$LC" ]; then
    ( mkdir -p /tmp/lc && tar xJf "$R/.llamacpp/llama.cpp.tar.xz" -C /tmp/lc && cd $LC && \
      cmake -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/lc/cfg.log 2>&1 && \
      nice cmake --build build --target llama-bench llama-quantize -j 14 > /tmp/lc/build.log 2>&1 && \
      mkdir -p /tmp/lc/ready && ln -sf $LC/build/bin/llama-quantize /tmp/lc/ready/llama-quantize && \
      ln -sf $LC/build/bin/llama-bench /tmp/lc/ready/llama-bench
      echo "llama.cpp build rc=$? at +$(( $(date +%s) - T0 )) s" > /tmp/lc/done.txt ) &
  fi
  tag=$(echo "$presets" | tr ',:' '__' | cut -c1-60)
  timeout $(left) python3 "$R/scripts/bench_decode_vs_llamacpp.py" --workdir /tmp/w --json "$OUT/bench_$tag.json" \
    --presets "$presets" --precisions "$precisions" --engines edgekit-fused --tokens 64 --repeats 2 \
    --llama-bench /tmp/lc/ready/llama-bench --llama-quantize /tmp/lc/ready/llama-quantize \
    --wait-llama-s $(( $(left) - 150 )) > "$OUT/bench_$tag.txt" 2> "$OUT/bench_${tag}_stderr.log"
  echo "bench rc=$? at +$(( $(date +%s) - T0 )) s; $(cat /tmp/lc/done.txt 2>/dev/null)"
  tail -30 "$OUT/bench_$tag.txt"
  rm -rf /tmp/w  # the GGUF files: several GB each
  ;;
long)
  timeout $(left) python3 "$R/tools/long_context_check.py" --preset llama-3.2-1b --precision int8 --depth 4096 --tokens 16 \
    --json "$OUT/long_context.json" > "$OUT/long_context.log" 2>&1
  echo "long-context check rc=$?"; head -5 "$OUT/long_context.log"
  ;;
ptx)
  for p in ${2//,/ }; do
    ( timeout $(( $(left) - 60 )) python3 -m edgekit build "preset:$p" --target orin --dev-key --precision int8 \
        --context 512 --buckets 64,512 --no-onnx -o "/tmp/b-$p" --force --json > "$OUT/build_orin_$p.json" 2> "$OUT/build_orin_$p.log"
      echo "build $p rc=$?"
      timeout $(( $(left) - 10 )) python3 -m edgekit verify "/tmp/b-$p" --allow-dev-key --golden-backend gpu --json \
        > "$OUT/verify_orin_$p.json" 2> "$OUT/verify_orin_$p.log"
      echo "verify $p on the GPU (sm_87 PTX) rc=$?" )
  done
  ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac
