#!/usr/bin/env bash
# GPU-machine validation in two calls (the default model's GGUF is carried in two halves:
# .devcarry_a/part then .devcarry_b/part; see README "GPU machine").
#   stage 1: setup, every @pytest.mark.gpu test, the NVML power check
#   stage 2: join the GGUF; build for h200 and orin; verify (golden vectors on the GPU, sm_87 PTX JIT);
#            run the h200 bundle on the plugins vs the CPU reference; serve vs run, 8 streaming clients, 100 swaps under load
# Results go to $OUT (JSON + logs).
set -uo pipefail
stage=${1:?stage 1 or 2}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source tools/gpu_setup.sh || exit 1
cd "$EDGEKIT_RUN_DIR"   # outside the repo: ./edgekit must not shadow the mapped package
ek() { python3 -m edgekit "$@"; }
if [ "$stage" = 1 ]; then
  mkdir -p /tmp/parts && cp "$R/.devcarry_a/part" /tmp/parts/a
  nvidia-smi --query-gpu=name,driver_version,power.draw --format=csv | tee "$OUT/nvidia_smi.txt"
  timeout 220 python3 -m pytest -q -m gpu "$R/tests" -c "$R/pyproject.toml" --rootdir "$R" -p no:cacheprovider -rfE 2>&1 | tail -80 > "$OUT/pytest_gpu.log"; tail -30 "$OUT/pytest_gpu.log"
  [ -f "$R/tools/gpu_power_check.py" ] && timeout 90 python3 "$R/tools/gpu_power_check.py" --json "$OUT/power.json" 2>&1 | tail -25
  exit 0
fi
cat /tmp/parts/a "$R/.devcarry_b/part" > /tmp/model.gguf && sha256sum /tmp/model.gguf
M=/tmp/model.gguf
P="What is the capital of France?"
( time ek build $M --target h200 --dev-key -o /tmp/b-h200 --force --json > "$OUT/build_h200.json" ) 2>&1 | tail -3
ek verify /tmp/b-h200 --allow-dev-key --json > "$OUT/verify_h200.json"; echo "verify h200 rc=$?"
ek run /tmp/b-h200 --allow-dev-key --skip-golden -p "$P" -n 32 --json > "$OUT/run_h200_gpu.json"; echo "run gpu rc=$?"
ek run /tmp/b-h200 --allow-dev-key --skip-golden -p "$P" -n 32 --json --no-cuda-graphs > "$OUT/run_h200_gpu_eager.json"; echo "run gpu eager rc=$?"
ek run /tmp/b-h200 --allow-dev-key --skip-golden -p "$P" -n 32 --json --device cpu > "$OUT/run_h200_cpu.json"; echo "run cpu rc=$?"
python3 - "$OUT" <<'PY'
import json, sys
o = sys.argv[1]
g, e, c = (json.load(open(f"{o}/{n}.json")) for n in ("run_h200_gpu", "run_h200_gpu_eager", "run_h200_cpu"))
print("gpu graphs:", g["text"][:80], g["stats"]["decode_tokens_per_s"], g["operators"])
print("gpu eager :", e["text"][:80], e["stats"]["decode_tokens_per_s"])
print("cpu ref   :", c["text"][:80])
n = min(len(g["token_ids"]), len(c["token_ids"]))
same = sum(a == b for a, b in zip(g["token_ids"], c["token_ids"]))
print(f"greedy tokens gpu-plugins vs cpu-reference: {same}/{n} identical; first divergence at",
      next((i for i, (a, b) in enumerate(zip(g["token_ids"], c["token_ids"])) if a != b), None))
PY
( time ek build $M --target orin --dev-key -o /tmp/b-orin --force --json > "$OUT/build_orin.json" ) 2>&1 | tail -3
ek verify /tmp/b-orin --allow-dev-key --golden-backend gpu --json > "$OUT/verify_orin_ptx_on_gpu.json"; echo "verify orin (sm_87 PTX on the GPU) rc=$?"
timeout 540 python3 "$R/scripts/bench_serve.py" /tmp/b-h200 --allow-dev-key --swaps 100 --clients 8 --new-tokens 128 --seconds 15 --json "$OUT/bench_serve_gpu.json" 2>&1 | grep -v '^{' | tail -14
