#!/usr/bin/env bash
# The main job on the default model: install, then generate an answer on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
edgekit info
edgekit generate --prompt "What is the capital of France?" --max-new-tokens 32
