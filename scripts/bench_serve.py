#!/usr/bin/env python
"""Serve vs run on the same bundle: batch-1 decode, N streaming clients, S swaps under that load. Every phase bounded.

Prints a table and JSON (--json PATH, rewritten after every phase, so a phase
that fails or a run cut short still leaves what was measured, with the error).
Everything runs on loopback; the server is in this process, the clients in a
spawned process. Figures say where they were measured (GPU name, or CPU with
its load average).

1. batch1: `edgekit run`'s generator (runtime.run_generator: graphed prefill,
   the decode path select_decode_path picks, graphed) vs one streaming client
   of `serve` on the same bundle, prompt and length, taking turns request by
   request (client view: tokens after the first over the time after the first
   chunk). Done-when (H200): >= 0.9x. Bounded by --repeats and --batch1-budget-s.
2. scaling: aggregate tokens/s of N streaming clients vs one (two phases of
   each, --seconds/2 long). Done-when: 8 clients >= 2.5x.
3. swaps: S signed swaps of --op (the bundle's own plugin, re-signed under new
   versions) while N clients stream, for at most --swap-budget-s (swaps left
   then are reported as not attempted, not as failures): failed requests, the
   device thread's switch pause p50/p99, the clients' inter-chunk gap p99.
   Done-when: 0 failed, pause p99 <= 5 ms. Where upload -> active goes is reported per stage (the store's steps:
   received, verified, golden_checked, staged, switched...; activated: re-verify + plugin load + graph capture)
   with the graphs each swap re-captured and kept (only the graphs that call the operator are re-captured).
The active decode path is reported before and after the swaps (a swap of an
operator the fused kernels subsume moves decode to the per-operator path).

    python scripts/bench_serve.py BUNDLE --allow-dev-key --swaps 100 --clients 8    # GPU (tools/gpu_serve_bench.sh)
    python scripts/bench_serve.py --tiny --new-tokens 64 --swaps 10 --seconds 6      # CPU smoke (small numbers)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_harness import ADMIN_TOKEN, add_bundle_args, client_process, open_bench_bundle, plugin_packages, serving, where  # noqa: E402


class RunBaseline:
    """What `edgekit run` does, through the same function (edgekit.runtime.run_generator)."""

    def __init__(self, bundle, prompt: list[int], new_tokens: int, cuda_graphs: bool):
        from edgekit.runtime.run_generator import run_generator

        self.setup = run_generator(bundle, prompt, new_tokens, cuda_graphs=cuda_graphs)
        self.prompt, self.new_tokens = prompt, new_tokens
        self.once()  # warm-up

    def once(self) -> float:
        from edgekit.generate import GenerationStats

        stats = GenerationStats()
        list(self.setup.generator.stream(self.prompt, self.new_tokens, stop_ids=(), stats=stats))
        return stats.decode_tokens_per_s or 0.0


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
    # run_clients stops sending at `seconds`; the grace covers requests in flight then
    records = pool.submit(run_clients, url, body, clients=clients, seconds=seconds, stream=True).result(timeout=seconds + 60)
    return summarize(records, time.perf_counter() - t)


class Report:
    """The JSON result, written after every phase; a failed phase leaves its error and the others go on."""

    def __init__(self, path: Path | None, out: dict):
        self.path, self.out = path, out
        out.setdefault("errors", {})
        out["phases_done"] = []

    def save(self) -> None:
        if self.path:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.out, indent=2))
            tmp.replace(self.path)

    def phase(self, name: str, fn) -> bool:
        t = time.perf_counter()
        try:
            fn()
            self.out["phases_done"].append(name)
            return True
        except Exception as e:  # a benchmark phase: record why and keep the other phases' numbers
            self.out["errors"][name] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            return False
        finally:
            self.out.setdefault("phase_seconds", {})[name] = round(time.perf_counter() - t, 2)
            self.save()


def swap_phase(pool, url: str, stack, packages: list[bytes], args, prompt: list[int], budget_s: float) -> dict:
    """Signed swaps of one operator while args.clients clients stream: requests, hand-over pauses, stage timings."""
    from edgekit.runtime.swap_load import run_swap_load

    engine = stack.engine
    n_pause, n_inst, n_load, n_prep, n_event = (len(engine.swap_pauses_s), len(stack.admin.install_ms),
                                                len(stack.load_ms), len(engine.swap_prepares), len(stack.events))
    t = time.perf_counter()
    swap = pool.submit(run_swap_load, url, ADMIN_TOKEN, packages, clients=args.clients, prompt=prompt,
                       max_tokens=args.new_tokens, max_seconds=budget_s, stream=True,
                       extra_body={"ignore_eos": True}).result(timeout=budget_s + 120)
    during = summarize(swap.records, time.perf_counter() - t)
    pauses = sorted(1000 * p for p in engine.swap_pauses_s[n_pause:])
    return {**swap.to_dict(), "load": during,
            "switch_pauses": len(pauses),
            "switch_pause_ms_p50": statistics.median(pauses) if pauses else None,
            "switch_pause_ms_p99": pauses[min(int(0.99 * len(pauses)), len(pauses) - 1)] if pauses else None,
            "switch_pause_ms_max": pauses[-1] if pauses else None,
            "stages_ms_p50": stage_medians(stack.admin.install_ms[n_inst:], stack.load_ms[n_load:],
                                           engine.swap_prepares[n_prep:]),
            "graphs_per_swap": graph_counts(engine.swap_prepares[n_prep:]),
            # probation verdicts and rollbacks run on serving's admin worker, beside the installs: a rollback
            # re-captures graphs there (the race behind a golden check refused with "operation not permitted")
            "admin_events": event_counts(stack.events[n_event:])}


def events_text(events: dict | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in (events or {}).items()) or "none"


def event_counts(events: list[dict]) -> dict:
    """How many serving events of each kind (rollback, probation_passed, probation_failed, ...)."""
    counts: dict[str, int] = {}
    for e in events:
        counts[e["kind"]] = counts.get(e["kind"], 0) + 1
    return dict(sorted(counts.items()))


def stage_medians(installs: list[dict], loads: list[float], prepares: list[dict]) -> dict:
    """Median ms of each stage of upload -> active (the store's steps, then activation and what it contains)."""
    names = dict.fromkeys(k for i in installs for k in i)
    out = {k: statistics.median(i[k] for i in installs if k in i) for k in names}
    if loads:
        out["activated.plugin_load"] = statistics.median(loads)
    if prepares:
        out["activated.graphs_prepare"] = statistics.median(1000 * p["prepare_s"] for p in prepares)
    return {k: round(v, 2) for k, v in out.items()}


def graph_counts(prepares: list[dict]) -> dict:
    """Which graphs the swaps re-captured and which they kept (the most common split, and how often)."""
    splits = [(tuple(p["captured"]), tuple(p["reused"])) for p in prepares]
    if not splits:
        return {}
    (captured, reused), n = max(((k, splits.count(k)) for k in set(splits)), key=lambda kv: kv[1])
    return {"captured": list(captured), "reused": list(reused), "swaps_with_this_split": n, "swaps": len(splits)}


def metrics_decode_path(url: str) -> list[str]:
    """The edgekit_decode_path samples of /metrics (what a fleet scrape sees)."""
    import httpx

    text = httpx.get(url + "/metrics", timeout=30).text
    return [line for line in text.splitlines() if line.startswith("edgekit_decode_path{")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bundle_args(ap)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0, help="length of the 1-vs-N phases, both kinds together")
    ap.add_argument("--swaps", type=int, default=100)
    ap.add_argument("--swap-budget-s", type=float, default=120.0, help="the swap phase stops uploading after this")
    ap.add_argument("--op", default="rmsnorm", help="operator to swap (attention_prefill keeps the fused decode path)")
    ap.add_argument("--repeats", type=int, default=5, help="serve/run turns for the batch-1 comparison")
    ap.add_argument("--batch1-budget-s", type=float, default=60.0, help="no new serve/run turn starts after this")
    ap.add_argument("--no-cuda-graphs", action="store_true")
    ap.add_argument("--decode-path", default="fused", help="serve's --decode-path for phases 1-3")
    ap.add_argument("--json", dest="json_path", type=Path)
    args = ap.parse_args()

    from edgekit.runtime.swap_load import run_clients

    t_start = time.perf_counter()
    b = open_bench_bundle(ap, args)
    prompt = [(7 * i + 3) % b.config.vocab_size for i in range(args.prompt_len)]
    body = {"prompt": prompt, "max_tokens": args.new_tokens, "ignore_eos": True}
    rep = Report(args.json_path, {"bundle": str(b.root), "model": b.config.name, "backend": b.backend,
                                  "new_tokens": args.new_tokens, "prompt_tokens": args.prompt_len, "clients": args.clients,
                                  "op": args.op, "measured_on": where(b)})
    out = rep.out
    graphs = not args.no_cuda_graphs
    run = RunBaseline(b, prompt, args.new_tokens, graphs)
    out["run_decode_path"], out["run_prefill_path"] = run.setup.decode_path, run.setup.prefill_path
    buckets = tuple(x for x in (1, 2, 4, 8, 16) if x < args.clients) + (args.clients,)
    with serving(b, max_waiting=2 * args.clients, batch_buckets=buckets, max_queue_wait_s=30.0,
                 cuda_graphs=graphs, decode_path=args.decode_path) as (url, stack), client_process() as pool:
        engine = stack.engine
        out["serve_graphed"] = engine.graphed
        out["serve_decode_path"] = engine.decode_path.to_dict()
        out["startup_s"] = round(time.perf_counter() - t_start, 2)
        rep.save()

        def batch1() -> None:
            load_phase(pool, url, body, 1, 2.0)  # warm-up: first requests, client process imports
            # serve and run take turns, request by request, so a busy machine weighs on both alike
            # and the CPU time this process spends per token (all its threads: the device thread, the event loop):
            # far less sensitive than tokens/s to other work on a shared machine, it shows serve's overhead per token
            run_rates, serve_rates, run_cpu, serve_cpu = [], [], [], []
            out["rounds"] = {"run": run_rates, "serve": serve_rates, "run_cpu_ms_per_token": run_cpu,
                             "serve_cpu_ms_per_token": serve_cpu}
            deadline = time.monotonic() + args.batch1_budget_s
            while len(run_rates) < args.repeats and time.monotonic() < deadline:
                c = time.process_time()
                run_rates.append(run.once())
                run_cpu.append(1000 * (time.process_time() - c) / args.new_tokens)
                c = time.process_time()
                rec = pool.submit(run_clients, url, body, clients=1, seconds=args.batch1_budget_s, stream=True,
                                  max_requests_per_client=1).result(timeout=args.batch1_budget_s + 30)
                serve_cpu.append(1000 * (time.process_time() - c) / args.new_tokens)
                serve_rates.append(summarize(rec, 1.0)["client_decode_tokens_per_s_median"] or 0.0)
            out["run_decode_tokens_per_s"] = statistics.median(run_rates)
            out["serve_decode_tokens_per_s"] = statistics.median(serve_rates)
            out["serve_vs_run"] = out["serve_decode_tokens_per_s"] / out["run_decode_tokens_per_s"]
            out["run_cpu_ms_per_token"] = statistics.median(run_cpu)
            out["serve_cpu_ms_per_token"] = statistics.median(serve_cpu)

        def scaling() -> None:
            # one client, then N, twice over: aggregate tokens/s of each kind over both of its phases
            phases: dict[int, list[dict]] = {1: [], args.clients: []}
            for _ in range(2):
                for n in phases:
                    phases[n].append(load_phase(pool, url, body, n, args.seconds / 4))
            one, many = _merge(phases[1]), _merge(phases[args.clients])
            out["one_client"], out["n_clients"] = one, many
            out["n_vs_one_aggregate"] = (many["aggregate_tokens_per_s"] / one["aggregate_tokens_per_s"]
                                         if one["aggregate_tokens_per_s"] else None)
            out["decode_steps_per_batch_bucket"] = dict(engine.step_batches)
            out["admin_events_scaling"] = event_counts(stack.events)

        def swaps() -> None:
            packages = plugin_packages(b, args.op, range(2, args.swaps + 2))
            out["swaps"] = {**swap_phase(pool, url, stack, packages, args, prompt, args.swap_budget_s),
                            "active_after": engine.table.sources()[args.op],
                            "decode_path_after": engine.decode_path.to_dict()}

        rep.phase("batch1", batch1)
        rep.phase("scaling", scaling)
        if args.swaps > 0:
            rep.phase("swaps", swaps)

    out["measured_on"] = where(b)
    out["total_s"] = round(time.perf_counter() - t_start, 2)
    rep.save()
    print_table(out, args)
    print(json.dumps(out))
    sys.exit(1 if out["errors"] else 0)


def stages(sw: dict) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in (sw.get("stages_ms_p50") or {}).items()) or "-"


def graphs_split(sw: dict) -> str:
    g = sw.get("graphs_per_swap") or {}
    return f"{len(g.get('captured', []))} / {len(g.get('reused', []))}" if g else "-"


def print_table(out: dict, args) -> None:
    def num(v, fmt=".1f"):
        return "-" if v is None else format(v, fmt)

    one, many, sw = out.get("one_client") or {}, out.get("n_clients") or {}, out.get("swaps") or {}
    load = sw.get("load") or {}
    rows = [
        ("decode path: run / serve", f"{out['run_decode_path']['path']} / {out['serve_decode_path']['path']}"),
        ("run decode tok/s (batch 1)", num(out.get("run_decode_tokens_per_s"))),
        ("serve decode tok/s (1 streaming client)", num(out.get("serve_decode_tokens_per_s"))),
        ("serve / run  (H200 goal >= 0.9)", num(out.get("serve_vs_run"), ".2f")),
        ("CPU ms per token in this process: run / serve", f"{num(out.get('run_cpu_ms_per_token'), '.3f')} / "
                                                         f"{num(out.get('serve_cpu_ms_per_token'), '.3f')}"),
        (f"aggregate tok/s, 1 vs {args.clients} clients", f"{num(one.get('aggregate_tokens_per_s'))} vs {num(many.get('aggregate_tokens_per_s'))}"),
        (f"{args.clients} / 1 aggregate  (goal >= 2.5)", num(out.get("n_vs_one_aggregate"), ".2f")),
        (f"swaps of {args.op}: ok / failed / not attempted", f"{sw.get('swaps_ok', '-')} / {len(sw.get('swaps_failed', []))} / {sw.get('swaps_not_attempted', '-')}"),
        ("requests during swaps ok / failed  (goal 0 failed)", f"{load.get('ok', '-')} / {load.get('failed', '-')}"),
        ("switch pause p50 / p99 ms  (goal p99 <= 5)", f"{num(sw.get('switch_pause_ms_p50'), '.3f')} / {num(sw.get('switch_pause_ms_p99'), '.3f')}"),
        ("client gap p99 ms, without / with swaps", f"{num(many.get('gap_ms_p99'), '.2f')} / {num(load.get('gap_ms_p99'), '.2f')}"),
        ("upload->active p50 / p99 ms", f"{num(sw.get('swap_request_ms_p50'))} / {num(sw.get('swap_request_ms_p99'))}"),
        ("decode path after the swaps", (sw.get("decode_path_after") or {}).get("path", "-")),
        ("upload->active stages p50 ms", stages(sw)),
        ("graphs re-captured / kept per swap", graphs_split(sw)),
        (f"serving events under the 1-vs-{args.clients} load (no swaps)", events_text(out.get("admin_events_scaling"))),
    ]
    print(f"serve vs run, {out['model']} ({out['backend']}, serve {'graphed' if out.get('serve_graphed') else 'eager'}), "
          f"{out['measured_on']}; {out.get('total_s')} s in all")
    for k, v in rows:
        print(f"  {k:<60}{v}")
    for phase, err in out["errors"].items():
        print(f"  FAILED phase {phase}: {err}")


if __name__ == "__main__":
    main()
