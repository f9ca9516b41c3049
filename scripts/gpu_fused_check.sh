#!/usr/bin/env bash
# Short GPU check of the fused decode path and the graphed prefill (one call): the GPU tests of
# tests/edgekit/runtime/test_fused_decode_gpu.py, then `edgekit run --json` on an h200 bundle of the
# smollm2-135m preset (random weights, fp16): decode and prefill paths, tokens vs the CPU reference.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source scripts/gpu_setup.sh || exit 1
cd "$EDGEKIT_RUN_DIR"
timeout 120 python3 -m pytest -q "$R/tests/edgekit/runtime/test_fused_decode_gpu.py" -c "$R/pyproject.toml" --rootdir "$R" \
  -p no:cacheprovider -p no:randomly -rfE 2>&1 | tail -30 > "$OUT/pytest_fused_decode_gpu.log"; tail -6 "$OUT/pytest_fused_decode_gpu.log"
timeout 90 python3 -m edgekit build preset:smollm2-135m --target h200 --dev-key --precision fp16 --context 512 --buckets 64,256 \
  -o /tmp/b135 --json --no-onnx > /tmp/b135.json 2> "$OUT/build.err" || tail -5 "$OUT/build.err"
timeout 60 python3 -m edgekit run /tmp/b135 --allow-dev-key --skip-golden --raw -p "hello world" -n 24 --json > "$OUT/run_gpu.json"; echo "run gpu rc=$?"
timeout 60 python3 -m edgekit run /tmp/b135 --allow-dev-key --skip-golden --raw -p "hello world" -n 24 --json --device cpu > "$OUT/run_cpu.json"; echo "run cpu rc=$?"
python3 - "$OUT" <<'PY'
import json, sys
g, c = (json.load(open(f"{sys.argv[1]}/{n}.json")) for n in ("run_gpu", "run_cpu"))
print("decode path:", g["decode_path"], "| prefill path:", g["prefill_path"])
print("gpu: ttft %.2f ms, decode %.0f tok/s; cpu: ttft %.0f ms" % (1000 * g["stats"]["time_to_first_token_s"], g["stats"]["decode_tokens_per_s"], 1000 * c["stats"]["time_to_first_token_s"]))
print("tokens equal gpu vs cpu reference:", g["token_ids"] == c["token_ids"], g["token_ids"][:6], c["token_ids"][:6])
PY
