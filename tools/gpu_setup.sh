#!/usr/bin/env bash
# On the GPU machine (no network): install the carried wheels (.whl/) into /tmp/site and make edgekit
# importable without pip: a symlink tree /tmp/pkg/edgekit mirrors pyproject's package-dir mapping
# (edgekit.kernels -> kernels/, ...). An editable install there fell back to a mode that ignores the
# mapping, and running from the repo root lets ./edgekit shadow the mapped package, so callers
# should `cd "$EDGEKIT_RUN_DIR"` (outside the repo) before running python.
# Usage: source tools/gpu_setup.sh   (sets R=repo root, PYTHONPATH, EDGEKIT_RUN_DIR)
R=$(pwd)
source "$R/scripts/package_dirs.sh" || return 1  # MAPPED_DIRS: the package-dir mapping's folders, read from setup.py
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
fi
map_package() {  # $1 a source tree, $2 the folder to put on PYTHONPATH: pyproject's package-dir mapping as symlinks
  rm -rf "$2" && mkdir -p "$2/edgekit"
  for f in "$1"/edgekit/*; do ln -s "$f" "$2/edgekit/"; done
  for d in $MAPPED_DIRS; do ln -s "$1/$d" "$2/edgekit/$d"; done
}
map_package "$R" /tmp/pkg
export PYTHONPATH=/tmp/pkg:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export EDGEKIT_RUN_DIR=/tmp/run && mkdir -p "$EDGEKIT_RUN_DIR"
(cd "$EDGEKIT_RUN_DIR" && python3 - <<'PY'
import importlib.util, sys
import torch, triton, edgekit.kernels.aot, edgekit.power
# the wheels .whl carries: a fresh machine without them would run on and fail test by test (gguf intake, TUF, serve)
missing = [m for m in ("gguf", "tuf", "fastapi", "cryptography") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_setup: {', '.join(missing)} not importable: this machine has not had .whl installed (a fresh "
             "machine forgets earlier calls' installs); carry .whl with this call (tools/gpu_carry.sh makes it)")
print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
PY
) || return 1
