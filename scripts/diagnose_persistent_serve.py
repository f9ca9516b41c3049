#!/usr/bin/env python3
"""Issue 13 diagnosis on the GPU: the serving engine on one bundle, decode path and lookahead as given, requests
served directly or over HTTP; prints JSON: non-finite decode steps reported (and the row positions of the first
ones), the tokens, the decode path taken.

    python3 scripts/diagnose_persistent_serve.py BUNDLE --path persistent --lookahead 1 --requests 1 --tokens 64

Run it once per configuration (a fresh process: PDL and tiles are fixed at a kernel's first compile), e.g. with
EDGEKIT_PDL=0 in the environment. Measured on the GPU it runs on; the bundle's weights decide nothing here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--path", default="persistent")
    ap.add_argument("--lookahead", type=int, default=1)
    ap.add_argument("--requests", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--buckets", default="1,2,4,8")
    ap.add_argument("--stack", action="store_true", help="the engine of a ServingStack (guarded ops, store), as serve")
    ap.add_argument("--before-fused", action="store_true", help="a fused stack served and closed first (bench_serve)")
    ap.add_argument("--run-baseline", action="store_true", help="`run`'s graphed generator made and run first, kept")
    ap.add_argument("--http", type=float, default=0.0, help="serve over HTTP (bench_serve's harness) for this many s")
    ap.add_argument("--prompt-len", type=int, default=10)
    ap.add_argument("--bench-prompt", action="store_true", help="bench_serve's prompt ((7i + 3) mod V)")
    ap.add_argument("--no-golden", action="store_true", help="open the bundle without its golden check (bench_serve)")
    a = ap.parse_args()

    from edgekit.runtime.bundle_runtime import open_bundle
    from edgekit.runtime.engine import Engine

    b = open_bundle(a.bundle, [], allow_dev_key=True, golden=not a.no_golden, device="cuda")
    buckets = tuple(int(x) for x in a.buckets.split(","))
    V = b.config.vocab_size
    prompts = [[(7 * j + 3) % V if a.bench_prompt else 5 + 3 * i + j for j in range(a.prompt_len + (0 if a.bench_prompt else i))]
               for i in range(a.requests)]
    keep = []
    if a.run_baseline:
        from edgekit.generate import GenerationStats
        from edgekit.runtime.run_generator import run_generator

        setup = run_generator(b, prompts[0], a.tokens)
        list(setup.generator.stream(prompts[0], a.tokens, stop_ids=(), stats=GenerationStats()))
        keep.append(setup)
    if a.before_fused:
        first = _stack(b, "fused", buckets)
        for j in [first.engine.submit(p, a.tokens, stop_ids=()) for p in prompts]:
            j.done.wait(120)
        first.close()
    bad, stack = [], None
    if a.http:
        return _http(a, b, buckets, prompts)
    if a.stack:
        stack = _stack(b, a.path, buckets)
        e = stack.engine
    else:
        e = Engine(b.decoder(), None, b.shapes, cuda_graphs=True, decode_path=a.path, lookahead=bool(a.lookahead),
                   batch_buckets=buckets)
    on_bad = e.on_nonfinite
    e.on_nonfinite = lambda: (bad.append([r.position for r in e._rows if r is not None]), on_bad and on_bad())
    try:
        t0 = time.perf_counter()
        jobs = [e.submit(p, a.tokens, stop_ids=()) for p in prompts]
        for j in jobs:
            j.done.wait(120)
        print(json.dumps({"path": a.path, "decode_path": e.decode_path.name, "lookahead": e.lookahead,
                          "requests": a.requests, "nonfinite_steps": len(bad), "first_bad_positions": bad[:4],
                          "seconds": time.perf_counter() - t0,
                          "errors": [str(j.error) for j in jobs if j.error is not None],
                          "stack": a.stack, "before_fused": a.before_fused, "golden": not a.no_golden,
                          "run_baseline": a.run_baseline,
                          "events": sorted({ev.get("kind", "?") for ev in stack.events}) if stack else None,
                          "tokens": [j.tokens for j in jobs]}))
    finally:
        (stack or e).close()


def _http(a, b, buckets, prompts) -> None:
    """As bench_serve's persistent phase: the harness's loopback server, one streaming client for a.http seconds."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from serve_harness import serving

    from edgekit.runtime.swap_load import run_clients

    body = {"prompt": prompts[0], "max_tokens": a.tokens, "ignore_eos": True}
    with serving(b, max_waiting=16, batch_buckets=buckets, max_queue_wait_s=30.0, decode_path=a.path) as (url, stack):
        bad = []
        on_bad = stack.engine.on_nonfinite
        e = stack.engine
        e.on_nonfinite = lambda: (bad.append([r.position for r in e._rows if r is not None]), on_bad and on_bad())
        recs = run_clients(url, body, clients=a.requests, seconds=a.http, stream=True)
        print(json.dumps({"path": a.path, "decode_path": e.decode_path.name, "http": True, "requests": len(recs),
                          "statuses": sorted({r["status"] for r in recs}), "nonfinite_steps": len(bad),
                          "first_bad_positions": bad[:4], "run_baseline": a.run_baseline, "before_fused": a.before_fused,
                          "golden": not a.no_golden, "tokens": []}))


def _stack(b, path: str, buckets):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from serve_harness import scratch_dir  # the benches' temp folder, removed at exit

    from edgekit.runtime.serving import ServingStack, open_store

    tmp = scratch_dir()
    return ServingStack(b, open_store(tmp / "store", b, [], allow_dev_key=True), batch_buckets=buckets,
                        decode_path=path)


if __name__ == "__main__":
    main()
