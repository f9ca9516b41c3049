#!/usr/bin/env python3
"""Decode tokens/s of the fused path with one kernel's tile (or every kernel's shared-memory carveout) changed, GPU only.

A kernel's tile is timed alone by tools/fused_tile_sweep.py and tools/attn_tile_sweep.py; this times it inside the
whole graphed decode step, where what runs beside it matters: an SM holds programs of two kernels at once (the
programmatic dependent launch lets the next kernel's programs in early) only where both fit one split of its
unified L1 / shared memory, so a kernel staging 72 KB of tiles between GEMVs that stage none may make the SMs
reconfigure at every boundary. Arms:

- ``base``: the default tiles;
- ``KERNEL:sN[,wM][,NAME=VALUE...]``: KERNEL (a kernel name, e.g. attn_split_combine) at num_stages N (and M
  warps) with the given constexprs, every other kernel at its default; several joined by '+';
- ``carveout:P`` (joined to tile parts by '+'): every compiled kernel's preferred
  shared-memory carveout set to P percent (cuFuncSetAttribute) before the arm's graph is captured.

Each arm gets its own engine on one set of random preset weights (batch 1, --context tokens of depth); the arms
without a carveout are timed interleaved (the order rotated), then the carveout arms the same way after the
attribute is set (it belongs to the compiled kernel, which every engine shares; the phases are not interleaved,
so put a ``base``-tiled carveout arm beside the others). Prints a table and JSON; says what it was measured on.

    python3 tools/step_ab.py preset:qwen3-1.7b --precision fp16 \
        --arms "base;attn_split_combine:s1;carveout:100;attn_split_combine:s1+carveout:100" --json ab.json

H100 80GB HBM3, 2026-12-05, depth 512, 64 tokens, median of 5-7 interleaved runs (spread 0.1-0.3%; an arm equal to
the default measured within 0.2% of ``base``), fp16 tok/s:
- the attention's key block (attn_split_combine, 3 stages): qwen3-1.7b 64 -> 128 keys 613.0 -> 624.8 (int8 813.1 ->
  834.4, int4 900.7 -> 928.0, depth 2048 572.9 -> 596.9), qwen3-0.6b 1096 -> 1141, gemma-3-1b (head_dim 256) 32 ->
  64 keys 695.1 -> 745.0: now the default where the GPU has the shared memory (attention_triton._decode_default);
- one stage instead of three (22.5 KB of shared memory instead of 70 KB): qwen3-1.7b -2.0%, qwen3-0.6b -2.0%,
  gemma-3-1b +2.3% (but 64-key blocks at three stages +7.2%); two stages of 128 keys -0.8% / -2.3%;
- carveout 100% on every kernel (not interleaved with the arms above): qwen3-1.7b -2.8%, qwen3-0.6b +3.6%, gemma-3-1b
  +1.6%: no single setting wins, not adopted;
- no other single change won by more than 1.4% on qwen3-1.7b and qwen3-0.6b: the QKV's 4 pairs a program, 8 warps
  or 1024-wide K steps; the o-projection's 2 or 8 rows or 8 warps; gate/up's 4 rows or 8 warps; down at 3 stages or
  8 rows; the attention at 2 warps (+0.8% / +1.4%; with 128-key blocks +0.0%), 8 warps (-1.2% / -1.8%) or 8 splits.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys

import torch

from edgekit.bench.fused_engine import FusedRuntimeEngine
from edgekit.bench.measure import timed
from edgekit.bench.runner import _cast, _prompt, quantized
from edgekit.kernels import triton_backend
from edgekit.model.presets import preset_config
from edgekit.model.weights import random_weights

_DEFAULT_VARIANTS = triton_backend.default_variants


def parse_arm(text: str) -> tuple[list[dict], int | None]:
    """``KERNEL:sN[,wM][,K=V...]`` parts and/or ``carveout:P`` joined by '+' -> ([{kernel, stages, constexprs}], P | None)."""
    tiles, carve = [], None
    for part in filter(None, text.split("+")):
        if part == "base":
            continue
        name, _, rest = part.partition(":")
        if name == "carveout":
            carve = int(rest)
            continue
        fields = rest.split(",")
        warps = [f for f in fields[1:] if f[:1] == "w" and f[1:].isdigit()]
        consts = [f for f in fields[1:] if f not in warps]
        if not fields[0][:1] == "s" or not fields[0][1:].isdigit() or len(warps) > 1 or not all("=" in f for f in consts):
            sys.exit(f"arm {text!r}: expected KERNEL:sN[,wN][,NAME=VALUE...], e.g. attn_split_combine:s1,w2,BLOCK_N=32")
        tiles.append({"kernel": name, "stages": int(fields[0][1:]), "warps": int(warps[0][1:]) if warps else None,
                      "constexprs": {k: int(v) for k, v in (f.split("=") for f in consts)}})
    return tiles, carve


def use_tiles(tiles: list[dict]) -> None:
    """Make the JIT path's default variants (what each new engine's operators pick) carry ``tiles``."""
    if not tiles:
        triton_backend.default_variants = _DEFAULT_VARIANTS
        return

    def patched(op, **kw):
        out = _DEFAULT_VARIANTS(op, **kw)
        for t in tiles:
            v = out.get(t["kernel"])
            if v is not None:
                out[t["kernel"]] = dataclasses.replace(v, num_stages=t["stages"], num_warps=t["warps"] or v.num_warps,
                                                       constexprs={**v.constexprs, **t["constexprs"]})
        return out

    triton_backend.default_variants = patched


def set_carveout(percent: int) -> int:
    """Every Triton kernel compiled so far in this process: preferred shared-memory carveout = ``percent``
    (-1: the driver's choice). Returns how many kernels were set."""
    from cuda.bindings import driver
    from triton.runtime.jit import JITFunction

    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    n = 0
    for obj in gc.get_objects():
        if not isinstance(obj, JITFunction):
            continue
        for caches in obj.device_caches.values():
            for kernel in caches[0].values():
                kernel._init_handles()
                err, = driver.cuFuncSetAttribute(kernel.function, attr, percent)
                if err != driver.CUresult.CUDA_SUCCESS:
                    sys.exit(f"cuFuncSetAttribute(carveout {percent}) on {kernel.name}: {err}")
                n += 1
    return n


def run_phase(cfg, w, arms: list[str], a, dev, rows: list, carveout: int | None = None) -> None:
    engines, secs = {}, {arm: [] for arm in arms}
    if carveout is not None:  # compile every arm's kernels first: the attribute belongs to a compiled kernel
        for arm in arms:
            use_tiles(parse_arm(arm)[0])
            eng = FusedRuntimeEngine(cfg, w, a.context + a.tokens + 64, a.tokens)
            eng.decode(eng.prefill(_prompt(cfg, a.context, 0, "cuda")), a.context, 2)
            eng.close()
        print(f"carveout {carveout}% set on {set_carveout(carveout)} compiled kernels", flush=True)
    for arm in arms:
        use_tiles(parse_arm(arm)[0])
        eng = FusedRuntimeEngine(cfg, w, a.context + a.tokens + 64, a.tokens)
        first = eng.prefill(_prompt(cfg, a.context, 0, "cuda"))
        eng.decode(first, a.context, a.tokens)  # compiles, captures, warms
        engines[arm] = (eng, first)
    use_tiles([])
    for r in range(a.repeats):  # interleaved, the order rotated: a clock or neighbour drift hits all alike
        for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
            eng, first = engines[arm]
            secs[arm].append(timed(lambda: eng.decode(first, a.context, a.tokens), dev)[1])
    for arm, (eng, _) in engines.items():
        tps = a.tokens / statistics.median(secs[arm])
        rows.append({"model": a.model, "precision": a.precision, "arm": arm, "decode_tokens_per_s": tps,
                     "runs_s": secs[arm]})
        print(f"{a.model:22} {a.precision:5} {arm:48}: {tps:8.1f} tok/s", flush=True)
        eng.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="preset:NAME")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--arms", default="base;attn_split_combine:s1", help="';'-separated arms (see above)")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    arms = [x.strip() for x in a.arms.split(";") if x.strip()]
    for arm in arms:
        parse_arm(arm)  # bad syntax stops here, before any GPU work
    dev = torch.device("cuda")
    cfg = preset_config(a.model)
    w = quantized(_cast(random_weights(cfg, seed=0, dtype=torch.float16), "cuda", torch.float16), a.precision)
    rows: list = []
    plain = [arm for arm in arms if parse_arm(arm)[1] is None]
    if plain:
        run_phase(cfg, w, plain, a, dev, rows)
    for percent in sorted({parse_arm(arm)[1] for arm in arms} - {None}):
        run_phase(cfg, w, [arm for arm in arms if parse_arm(arm)[1] == percent], a, dev, rows, carveout=percent)
        set_carveout(-1)
    doc = {"measured_on": f"GPU ({torch.cuda.get_device_name(dev)})", "batch": 1, "context": a.context,
           "tokens": a.tokens, "rows": rows}
    print(json.dumps(doc))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
