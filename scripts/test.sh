#!/usr/bin/env bash
# Install, check the import layer contracts, then run the whole test suite (GPU tests are skipped without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
bash scripts/lint_imports.sh
# The repo's top-level kernels/ folder (edgekit.kernels) must not shadow the registry package "kernels" that
# transformers imports: no current directory on sys.path, in pytest or in the commands tests start.
export PYTHONSAFEPATH=1
python -m pytest -q "$@"
