#!/usr/bin/env bash
# Install, check the import layer contracts, then run the whole test suite (GPU tests are skipped without a GPU).
# With no arguments the suite runs in two phases: every test not marked `serial` on one pytest-xdist worker per core
# (at most 4: each worker holds its own torch and models), then the `serial` tests (they time servers under load,
# deadlines and pauses) alone, so no neighbour's work skews a clock. Arguments go to one plain pytest run instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
bash scripts/lint_imports.sh
# The repo's top-level kernels/ folder (edgekit.kernels) must not shadow the registry package "kernels" that
# transformers imports: no current directory on sys.path, in pytest or in the commands tests start.
export PYTHONSAFEPATH=1
if [ "$#" -gt 0 ]; then
  exec python -m pytest -q "$@"
fi
workers=$(python -c 'import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))')
# worksteal: an idle worker takes queued tests from a busy one (the interpreter checks run for minutes)
python -m pytest -q -n "$workers" --dist worksteal -m "not serial"
python -m pytest -q -m serial
