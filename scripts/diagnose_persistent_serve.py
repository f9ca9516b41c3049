#!/usr/bin/env python3
"""Issue 13 diagnosis on the GPU: the serving engine on one bundle, decode path and lookahead as given, one or more
requests; prints JSON: non-finite decode steps reported, the tokens, the decode path taken.

    python3 scripts/diagnose_persistent_serve.py BUNDLE --path persistent --lookahead 1 --requests 1 --tokens 64

Run it once per configuration (a fresh process: PDL and tiles are fixed at a kernel's first compile), e.g. with
EDGEKIT_PDL=0 in the environment. Measured on the GPU it runs on; the bundle's weights decide nothing here.
"""

from __future__ import annotations

import argparse
import json
import time


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
    ap.add_argument("--prompt-len", type=int, default=10)
    ap.add_argument("--no-golden", action="store_true", help="open the bundle without its golden check (bench_serve)")
    a = ap.parse_args()

    from edgekit.runtime.bundle_runtime import open_bundle
    from edgekit.runtime.engine import Engine

    b = open_bundle(a.bundle, [], allow_dev_key=True, golden=not a.no_golden, device="cuda")
    buckets = tuple(int(x) for x in a.buckets.split(","))
    prompts = [[5 + 3 * i + j for j in range(a.prompt_len + i)] for i in range(a.requests)]
    if a.before_fused:
        first = _stack(b, "fused", buckets)
        for j in [first.engine.submit(p, a.tokens, stop_ids=()) for p in prompts]:
            j.done.wait(120)
        first.close()
    bad, stack = [], None
    if a.stack:
        stack = _stack(b, a.path, buckets)
        e = stack.engine
    else:
        e = Engine(b.decoder(), None, b.shapes, cuda_graphs=True, decode_path=a.path, lookahead=bool(a.lookahead),
                   batch_buckets=buckets)
    on_bad = e.on_nonfinite
    e.on_nonfinite = lambda: (bad.append(time.perf_counter()), on_bad and on_bad())
    try:
        t0 = time.perf_counter()
        jobs = [e.submit(p, a.tokens, stop_ids=()) for p in prompts]
        for j in jobs:
            j.done.wait(120)
        print(json.dumps({"path": a.path, "decode_path": e.decode_path.name, "lookahead": e.lookahead,
                          "requests": a.requests, "nonfinite_steps": len(bad), "seconds": time.perf_counter() - t0,
                          "errors": [str(j.error) for j in jobs if j.error is not None],
                          "stack": a.stack, "before_fused": a.before_fused, "golden": not a.no_golden,
                          "events": sorted({ev.get("kind", "?") for ev in stack.events}) if stack else None,
                          "tokens": [j.tokens for j in jobs]}))
    finally:
        (stack or e).close()


def _stack(b, path: str, buckets):
    import tempfile
    from pathlib import Path

    from edgekit.runtime.serving import ServingStack, open_store

    tmp = Path(tempfile.mkdtemp(prefix="edgekit-diag-"))
    return ServingStack(b, open_store(tmp / "store", b, [], allow_dev_key=True), batch_buckets=buckets,
                        decode_path=path)


if __name__ == "__main__":
    main()
