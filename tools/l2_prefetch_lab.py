#!/usr/bin/env python3
"""Does a layer's chain of fused GEMVs get faster when each kernel's successor finds its weights in L2? A lab.

A decode layer on the fused path is a chain of GEMV kernels (QKV, o-projection, gate/up, down), each reading its
weights from HBM once. Every kernel pays a ramp and a tail in which the bandwidth is idle (~3 us a kernel on an
H100: tools/step_ab.py, tools/mlp_fusion_lab.py). PDL's level 2 fills them from the consumer's side (the next
kernel's programs start early and prefetch their first tile) and lost at 1B-class shapes: the early programs take
SM slots from the bandwidth-bound kernel before them (kernels/pdl_launch.py). This lab tries the producer's side
without touching the kernels: while kernel i runs, a small prefetch kernel on a second stream of the same CUDA
graph (forked when kernel i starts, joined before kernel i+1) asks L2 for kernel i+1's weights
(``prefetch.global.L2``, one a 128-byte line), using a few SM slots.

Arms, per layer, over enough layers of distinct weights to exceed L2 (the shipped operators at their default tiles
through TritonOp, PDL off; arguments as tools/fused_tile_sweep.py makes them):

- ``chain``: QKV -> o -> gate/up -> down, as the step orders them (without the attention between QKV and o);
- ``prefetch<=N MB``: the same, each successor whose weights are at most N MB prefetched during its predecessor
  (gate/up's are 50 MB at qwen3-1.7b, as large as the L2: prefetched only where N allows);
- ``L2-warm``: the chain over one layer's weights replayed (an upper bound: every weight in L2 already), only where a
  layer's weights are at most half the L2 (not at qwen3-1.7b: 96 MB a layer).

A successor is prefetched only where its weights and the running kernel's fit the L2 together (else the running
kernel's stream evicts the prefetched lines before they are read).

    python tools/l2_prefetch_lab.py --presets qwen3-1.7b,smollm2-135m --json $OUT/l2_prefetch.json   # GPU

Figures are measured on the GPU the script runs on.

H100 80GB HBM3, 2026-12-06 (copy 3.02 TB/s, 16 prefetch programs; us a layer, chain against prefetch <= 10 / 30 /
60 MB): qwen3-1.7b 47.05 against 50.84 / 51.89 / 52.53; qwen3-0.6b 23.97 against 26.80 / 26.94 / 26.91;
smollm2-135m 14.06 against 14.88 / 14.89 / 14.71 (its L2-warm bound 10.75). With the side stream at priority -1:
qwen3-1.7b 46.40 against 51.18 / 51.11 (30 / 60 MB), qwen3-0.6b 24.53 against 27.32 / 27.21. The prefetching chain
lost 5-12% everywhere (what the second stream's kernel and the graph's fork and join cost was not separated from
what they hid). Not built into the step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fused_tile_sweep import _args, _cases, graphed_copy_bandwidth  # noqa: E402 (the sweep's shapes, call arguments)

LINE_BYTES = 128


@triton.jit
def _l2_prefetch_kernel(p_ptr, n_lines, BLOCK: tl.constexpr):
    """Ask L2 for lines [pid * BLOCK * k ...) of a byte buffer, BLOCK lines a step, every program a contiguous run."""
    per = tl.cdiv(tl.cdiv(n_lines, tl.num_programs(0)), BLOCK) * BLOCK
    start = tl.program_id(0) * per
    for i0 in range(start, tl.minimum(start + per, n_lines), BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        ptrs = p_ptr + tl.where(i < n_lines, i, i0).to(tl.int64) * 128
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // dummy $0", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)


def prefetch(t: torch.Tensor, programs: int = 16):
    flat = t.view(torch.uint8).reshape(-1)
    _l2_prefetch_kernel[(programs,)](flat, triton.cdiv(flat.numel(), LINE_BYTES), BLOCK=1024, num_warps=4)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="qwen3-1.7b,smollm2-135m")
    ap.add_argument("--limits-mb", default="10,30", help="comma list of N: an arm prefetching successors of <= N MB")
    ap.add_argument("--programs", type=int, default=16, help="programs of the prefetch kernel")
    ap.add_argument("--priority", type=int, default=0,
                    help="the prefetch stream's priority (negative: higher; -1 lets its programs in before the "
                         "running GEMV's later ones)")
    ap.add_argument("--json")
    args = ap.parse_args()
    from triton.testing import do_bench_cudagraph

    from edgekit.kernels.triton_backend import TritonOp
    from edgekit.model.presets import preset_config

    dev = torch.device("cuda")
    bw = graphed_copy_bandwidth(dev)
    l2 = int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0)) or (50 << 20)
    side = torch.cuda.Stream(dev, priority=args.priority)
    rows = []
    for preset in args.presets.split(","):
        cfg = preset_config(preset)
        cases = _cases(cfg)  # (operator, n, k) in the step's order: QKV, o, gate/up, down
        ops = [TritonOp(op) for op, _, _ in cases]
        layer_bytes = sum(2 * n * k for _, n, k in cases)
        copies = max(2, min(48, (400 << 20) // layer_bytes))
        weights = [[torch.randn(n, k, device=dev).to(torch.float16) / k ** 0.5 for _, n, k in cases]
                   for _ in range(copies)]
        layers = [[_args(op, cfg, w, dev) for (op, _, _), w in zip(cases, ws)] for ws in weights]

        def chain(layers_run, limit_bytes=0):
            main_stream = torch.cuda.current_stream()
            for li, layer in enumerate(layers_run):
                for j, (fn, a) in enumerate(zip(ops, layer)):
                    nxt = (li, j + 1) if j + 1 < len(layer) else (li + 1, 0)
                    w_next = weights[nxt[0] % len(weights)][nxt[1]] if limit_bytes else None
                    # the successor's weights must fit L2 beside the ones the running kernel streams through it
                    fork = (w_next is not None and w_next.nbytes <= limit_bytes
                            and w_next.nbytes + weights[li % len(weights)][j].nbytes <= l2)
                    if fork:
                        side.wait_stream(main_stream)
                        with torch.cuda.stream(side):
                            prefetch(w_next, args.programs)
                    fn(*a)
                    if fork:
                        main_stream.wait_stream(side)

        arms = [("chain", lambda: chain(layers), copies)]
        if layer_bytes <= l2 // 2:  # a bound only where one layer's weights stay in L2 across the replay
            arms.append(("L2-warm", lambda: chain(layers[:1] * copies), copies))
        else:
            rows.append({"preset": preset, "arm": "L2-warm", "skipped": f"a layer's {layer_bytes >> 20} MB of "
                         f"weights do not stay in the {l2 >> 20} MB L2"})
        arms += [(f"prefetch<={mb} MB", (lambda mb=mb: chain(layers, int(mb) << 20)), copies)
                 for mb in args.limits_mb.split(",")]
        for name, fn, n in arms:
            us = 1000 * do_bench_cudagraph(fn) / n
            rows.append({"preset": preset, "arm": name, "us_per_layer": us, "layer_bytes": layer_bytes,
                         "bandwidth_fraction": layer_bytes / (us * 1e-6) / bw})
        del layers, weights
        torch.cuda.empty_cache()
    doc = {"measured_on": f"GPU ({torch.cuda.get_device_name(dev)})", "copy_bytes_per_s": bw, "l2_bytes": l2,
           "side_stream_priority": args.priority, "EDGEKIT_PDL": os.environ.get("EDGEKIT_PDL"), "rows": rows}
    print(f"measured on {doc['measured_on']}, copy bandwidth {bw / 1e12:.2f} TB/s; a layer's four fused GEMVs, "
          f"CUDA-graph replay, PDL off")
    for r in rows:
        if "skipped" in r:
            print(f"{r['preset']:13} {r['arm']:18} n/a: {r['skipped']}")
            continue
        print(f"{r['preset']:13} {r['arm']:18} {r['us_per_layer']:7.2f} us a layer  "
              f"{100 * r['bandwidth_fraction']:5.1f}% of copy bw")
    if args.json:
        open(args.json, "w").write(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
