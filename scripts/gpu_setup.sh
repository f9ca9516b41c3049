#!/usr/bin/env bash
# On the GPU machine (no network): install the carried wheels (.whl/, see README "GPU machine") into
# /tmp/site and edgekit itself (editable, no deps: torch/triton/cuda-python are already there).
# Usage: source scripts/gpu_setup.sh
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
export PYTHONUNBUFFERED=1
python3 - <<'PY'
import torch, triton
print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
PY
