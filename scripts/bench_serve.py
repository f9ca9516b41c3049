#!/usr/bin/env python
"""Serve vs run on the same bundle: batch-1 decode, 8 streaming clients, 100 swaps under that load.

Prints a table and JSON (--json PATH). Everything runs on loopback; the server
is in this process, the clients in a spawned process. Figures say where they
were measured (GPU name, or CPU with its load average).

1. `run` decode tokens/s (the Generator + CUDA-graph decode step that `edgekit
   run` uses) vs one streaming client of `serve` (client view: tokens after the
   first over the time after the first chunk). Done-when (H200): >= 0.9x.
2. Aggregate tokens/s of N streaming clients vs one. Done-when: 8 clients >= 2.5x.
3. S signed swaps of one operator (the bundle's own plugin, re-signed under new
   versions) while N clients stream: failed requests, the device thread's switch
   pause p99, and the clients' inter-chunk gaps p99 with and without swaps.
   Done-when: 0 failed, pause p99 <= 5 ms.

    python scripts/bench_serve.py BUNDLE --allow-dev-key            # GPU: the lead's H200 run
    python scripts/bench_serve.py --tiny --new-tokens 16 --swaps 10  # CPU smoke (small numbers)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_harness import ADMIN_TOKEN, add_bundle_args, client_process, open_bench_bundle, plugin_packages, serving, where  # noqa: E402


class RunBaseline:
    """What `edgekit run` does: Generator over the bundle's decoder, CUDA-graph decode step on a GPU."""

    def __init__(self, bundle, prompt: list[int], new_tokens: int):
        from edgekit.generate import Generator

        dec = bundle.decoder()
        cache = dec.new_cache(1, bundle.shapes.max_seq_len)
        step = None
        if bundle.device.type == "cuda":
            from edgekit.runtime.cuda_graphs import GraphedDecodeStep

            step = GraphedDecodeStep(dec, cache)
        self.gen = Generator(dec, bundle.shapes, 0, cache=cache, decode_step=step)
        self.prompt, self.new_tokens = prompt, new_tokens
        self.once()  # warm-up

    def once(self) -> float:
        from edgekit.generate import GenerationStats

        stats = GenerationStats()
        list(self.gen.stream(self.prompt, self.new_tokens, stop_ids=(), stats=stats))
        return stats.decode_tokens_per_s


def summarize(records: list[dict], seconds: float) -> dict:
    from edgekit.runtime.swap_load import RequestRecord, quantile

    ok = [RequestRecord(**r) for r in records if r["status"] == 200 and not r["error"]]
    rates = [r.decode_tokens_per_s for r in ok if r.decode_tokens_per_s]
    gaps = [g for r in ok for g in r.gaps_s]
    tokens = sum(r.completion_tokens for r in ok)
    return {"requests": len(records), "ok": len(ok), "failed": len(records) - len(ok),
            "statuses": sorted({r["status"] for r in records}),
            "tokens": tokens, "seconds": round(seconds, 3), "aggregate_tokens_per_s": tokens / seconds if seconds else 0,
            "client_decode_tokens_per_s_median": statistics.median(rates) if rates else None,
            "gap_ms_p50": 1000 * quantile(gaps, 0.5) if gaps else None,
            "gap_ms_p99": 1000 * quantile(gaps, 0.99) if gaps else None,
            "failures": [r["error"] for r in records if r["status"] != 200 or r["error"]][:5]}


def _merge(phases: list[dict]) -> dict:
    seconds = sum(p["seconds"] for p in phases)
    tokens = sum(p["tokens"] for p in phases)
    return {**phases[-1], "requests": sum(p["requests"] for p in phases), "ok": sum(p["ok"] for p in phases),
            "failed": sum(p["failed"] for p in phases), "tokens": tokens, "seconds": round(seconds, 3),
            "aggregate_tokens_per_s": tokens / seconds if seconds else 0}


def load_phase(pool, url: str, body: dict, clients: int, seconds: float) -> dict:
    from edgekit.runtime.swap_load import run_clients

    t = time.perf_counter()
    records = pool.submit(run_clients, url, body, clients=clients, seconds=seconds, stream=True).result()
    return summarize(records, time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bundle_args(ap)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each load phase")
    ap.add_argument("--swaps", type=int, default=100)
    ap.add_argument("--op", default="rmsnorm")
    ap.add_argument("--repeats", type=int, default=5, help="serve/run turns for the batch-1 comparison")
    ap.add_argument("--no-cuda-graphs", action="store_true")
    ap.add_argument("--json", dest="json_path", type=Path)
    args = ap.parse_args()

    from edgekit.runtime.swap_load import run_swap_load

    b = open_bench_bundle(ap, args)
    path = b.root
    prompt = [(7 * i + 3) % b.config.vocab_size for i in range(args.prompt_len)]
    body = {"prompt": prompt, "max_tokens": args.new_tokens, "ignore_eos": True}
    out: dict = {"bundle": str(path), "model": b.config.name, "backend": b.backend, "new_tokens": args.new_tokens,
                 "prompt_tokens": args.prompt_len, "clients": args.clients}

    run = RunBaseline(b, prompt, args.new_tokens)
    with serving(b, max_waiting=2 * args.clients, batch_buckets=tuple(x for x in (1, 2, 4, 8, 16) if x < args.clients) + (args.clients,),
                 max_queue_wait_s=30.0, cuda_graphs=not args.no_cuda_graphs) as (url, stack), client_process() as pool:
        from edgekit.runtime.swap_load import run_clients

        out["serve_graphed"] = stack.engine.graphed
        load_phase(pool, url, body, 1, min(args.seconds, 5))  # warm-up
        # serve and run take turns, request by request, so a busy machine weighs on both alike
        run_rates, serve_rates = [], []
        for _ in range(args.repeats):
            run_rates.append(run.once())
            rec = pool.submit(run_clients, url, body, clients=1, seconds=600, stream=True, max_requests_per_client=1).result()
            serve_rates.append(summarize(rec, 1.0)["client_decode_tokens_per_s_median"] or 0.0)
        out["run_decode_tokens_per_s"] = statistics.median(run_rates)
        out["serve_decode_tokens_per_s"] = statistics.median(serve_rates)
        out["serve_vs_run"] = out["serve_decode_tokens_per_s"] / out["run_decode_tokens_per_s"]
        out["rounds"] = {"run": run_rates, "serve": serve_rates}
        # one client, then N, twice over: aggregate tokens/s of each kind over both of its phases
        phases = {1: [], args.clients: []}
        for _ in range(2):
            for n in phases:
                phases[n].append(load_phase(pool, url, body, n, args.seconds / 2))
        one, many = (_merge(phases[1]), _merge(phases[args.clients]))
        out["one_client"], out["n_clients"] = one, many
        out["n_vs_one_aggregate"] = many["aggregate_tokens_per_s"] / one["aggregate_tokens_per_s"] if one["aggregate_tokens_per_s"] else None
        out["decode_steps_per_batch_bucket"] = dict(stack.engine.step_batches)

        n_before = len(stack.engine.swap_pauses_s)
        packages = plugin_packages(b, args.op, range(2, args.swaps + 2))
        t = time.perf_counter()
        swap = pool.submit(run_swap_load, url, ADMIN_TOKEN, packages, clients=args.clients, prompt=prompt,
                           max_tokens=args.new_tokens, max_seconds=600, stream=True, extra_body={"ignore_eos": True}).result()
        during = summarize(swap.records, time.perf_counter() - t)
        pauses = sorted(1000 * p for p in stack.engine.swap_pauses_s[n_before:])
        out["swaps"] = {**swap.to_dict(), "load": during,
                        "switch_pause_ms_p50": statistics.median(pauses) if pauses else None,
                        "switch_pause_ms_p99": pauses[min(int(0.99 * len(pauses)), len(pauses) - 1)] if pauses else None,
                        "switch_pause_ms_max": pauses[-1] if pauses else None,
                        "active_after": stack.engine.table.sources()[args.op]}
    out["measured_on"] = where(b)

    rows = [
        ("run decode tok/s (batch 1)", f"{out['run_decode_tokens_per_s']:.1f}"),
        ("serve decode tok/s (1 streaming client)", f"{out['serve_decode_tokens_per_s'] or 0:.1f}"),
        ("serve / run  (H200 goal >= 0.9)", f"{out['serve_vs_run']:.2f}"),
        (f"aggregate tok/s, 1 vs {args.clients} clients", f"{one['aggregate_tokens_per_s']:.1f} vs {many['aggregate_tokens_per_s']:.1f}"),
        (f"{args.clients} / 1 aggregate  (goal >= 2.5)", f"{out['n_vs_one_aggregate'] or 0:.2f}"),
        ("swaps ok / failed", f"{swap.swaps_ok} / {len(swap.swaps_failed)}"),
        ("requests during swaps ok / failed  (goal 0 failed)", f"{during['ok']} / {during['failed']}"),
        ("switch pause p50 / p99 ms  (goal p99 <= 5)", f"{out['swaps']['switch_pause_ms_p50'] or 0:.3f} / {out['swaps']['switch_pause_ms_p99'] or 0:.3f}"),
        ("client gap p99 ms, without / with swaps", f"{many['gap_ms_p99'] or 0:.2f} / {during['gap_ms_p99'] or 0:.2f}"),
        ("upload->active p50 / p99 ms", f"{out['swaps']['swap_request_ms_p50'] or 0:.1f} / {out['swaps']['swap_request_ms_p99'] or 0:.1f}"),
    ]
    print(f"serve vs run, {out['model']} ({out['backend']}, serve {'graphed' if out['serve_graphed'] else 'eager'}), {out['measured_on']}")
    for k, v in rows:
        print(f"  {k:<52}{v}")
    if args.json_path:
        args.json_path.write_text(json.dumps(out, indent=2))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
