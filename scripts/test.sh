#!/usr/bin/env bash
# Install, then run the whole test suite (GPU tests are skipped without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pytest -q "$@"
