#!/usr/bin/env python3
"""Profile edgekit's graphed decode step on the GPU: kernels per token, time inside vs between kernels.

    source tools/gpu_setup.sh && cd $EDGEKIT_RUN_DIR && \
        python3 $R/tools/profile_decode.py preset:qwen2.5-1.5b preset:smollm2-135m --precision int8 --json $OUT/profile.json

Random preset weights (speed does not depend on values); measured on the GPU it runs on.
"""

from __future__ import annotations

import argparse
import json

import torch

from edgekit.bench.document import PRECISIONS
from edgekit.bench.engines import RuntimeEngine
from edgekit.bench.fused_engine import FusedRuntimeEngine
from edgekit.bench.profile import profile_decode
from edgekit.bench.runner import _cast, _prompt, quantized
from edgekit.model.presets import preset_config
from edgekit.model.weights import random_weights

ENGINES = {"per-operator": RuntimeEngine, "fused": FusedRuntimeEngine}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--precision", default="int8", choices=list(PRECISIONS),
                    help="; ".join(f"{k}: {v}" for k, v in PRECISIONS.items()) + " (edgekit.bench.document.PRECISIONS)")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--engine", default="per-operator", choices=["per-operator", "fused"],
                    help="the decode path profiled (fused: the bench's graphed engine of that path)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    name = torch.cuda.get_device_name()
    results = {}
    for spec in a.models:
        cfg = preset_config(spec)
        w = quantized(_cast(random_weights(cfg, seed=0, dtype=torch.float16), "cuda", torch.float16), a.precision)
        eng = ENGINES[a.engine](cfg, w, a.context + a.steps + 64, a.steps)
        prompt = _prompt(cfg, a.context, 0, "cuda")
        first = eng.prefill(prompt)
        p = profile_decode(eng, first, a.context, a.steps)
        results[spec] = p
        print(f"\n{spec} {a.precision} {a.engine} ctx {a.context} (measured on GPU, {name}): wall {p['wall_ms_per_token']:.3f} ms/token, "
              f"kernels {p['kernel_ms_per_token']:.3f} ms/token over {p['kernels_per_token']:.0f} kernels, "
              f"between kernels {p['between_kernels_ms_per_token'] or 0:.3f} ms/token")
        for k in p["top_kernels"]:
            print(f"  {k['us_per_token']:8.1f} us/token  {k['per_token']:5.0f} x {k['avg_us']:6.2f} us  {k['name']}")
        eng.close()
        del eng, w
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"measured_on": f"GPU ({name})", "precision": a.precision, "engine": a.engine, "context": a.context, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
