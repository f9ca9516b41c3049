#!/usr/bin/env bash
# Install, check the import layer contracts, then run the whole test suite (GPU tests are skipped without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
bash scripts/lint_imports.sh
python -m pytest -q "$@"
