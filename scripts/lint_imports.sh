#!/usr/bin/env bash
# Check the import-linter layer contracts of pyproject.toml ([tool.importlinter]).
# The source tree maps edgekit.kernels/.power/.export/.targets onto top-level folders
# (pyproject's package-dir); import-linter walks one package folder, so it runs on a
# copy staged in the layout the wheel installs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/package_dirs.sh
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/edgekit"
tar --exclude=__pycache__ -cf - -C edgekit . | tar -xf - -C "$stage/edgekit"
for sub in $MAPPED_DIRS; do
  mkdir -p "$stage/edgekit/$sub"
  tar --exclude=__pycache__ -cf - -C "$sub" . | tar -xf - -C "$stage/edgekit/$sub"
done
config="$PWD/pyproject.toml"
# from the stage: lint-imports puts the working directory first on sys.path
cd "$stage" && PYTHONPATH="$stage" lint-imports "$config" "$@"
