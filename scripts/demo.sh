#!/usr/bin/env bash
# The main job on the default model (SmolLM2-135M-Instruct), on this machine, no Jetson or GPU needed:
# install, make a signing key (once), build the signed bundle for the `orin` target, verify it, run it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
[ -f keys/edgekit.key ] || edgekit keys generate keys
# the README's paths: its later steps (serve, the OTA walkthrough) run on this bundle as it is
edgekit build --target orin --key keys/edgekit.key -o bundles/smollm2-orin --force
edgekit verify bundles/smollm2-orin --trust keys/edgekit.pub
edgekit run bundles/smollm2-orin --trust keys/edgekit.pub --skip-golden \
  --prompt "What is the capital of France?" --max-new-tokens 32
