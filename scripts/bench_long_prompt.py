#!/usr/bin/env python
"""A long prompt arriving while 4 requests stream: how long does any stream pause? (#32 row 2)

The server's engine prefills a prompt longer than a chunk (``--chunk``, 128 tokens by default on eager runners)
a slice at a time between decode steps, each slice sized so that it and the decode step after it fit one chunk's
time (``edgekit/runtime/prefill_slicing.py``). This measures, on the default model's real weights (or any model),
in one run on this machine:

- one chunk's time: a ``--chunk``-token prompt prefilled by the same engine while nothing else runs, 3 times
  before the run (after a warm-up) and 3 times after it: the median of the 6 is the reference, so a machine that
  speeds up or slows down during the run (a shared VM's neighbours) moves it as it moves the pauses;
- the 4 streams' gaps between tokens while a ``--prompt-tokens`` (2046) prompt is prefilled;
- the long prompt's slices (tokens and seconds), and one decode step's time before it arrived;
- the same prompt prefilled in one piece (``--chunk 0``'s behaviour), alone, for comparison.

Verdict: the longest gap is at most one chunk's time (a stream never waits for the whole prompt, nor for a chunk
and its own step). Prints a table and JSON (``--json PATH``); times are measured on this machine's CPU or GPU (said
in the output), with its load average.

    python scripts/bench_long_prompt.py --json long_prompt.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=None, help="a model path or preset:NAME (default: the default model)")
    ap.add_argument("--prompt-tokens", type=int, default=2046)
    ap.add_argument("--chunk", type=int, default=128, help="prefill chunk in tokens (serve --prefill-chunk-tokens)")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--max-request-s", type=float, default=None,
                    help="the engine's request time limit (default none; `edgekit serve` ends a request 300 s after "
                         "its arrival, and a prompt is then due within half of that: slices grow to meet it, and a "
                         "stream may wait longer than a chunk)")
    ap.add_argument("--json", dest="json_path", type=Path)
    args = ap.parse_args()

    import torch

    from edgekit.model.loader import load_model
    from edgekit.runtime.engine import DEFAULT_MAX_REQUEST_S, Engine
    from edgekit.shapes import StaticShapes

    torch.set_grad_enabled(False)
    model = load_model(args.model) if args.model else load_model()
    dec = model.decoder()
    bucket = -(-args.prompt_tokens // 64) * 64
    shapes = StaticShapes(buckets=(16, bucket), max_seq_len=bucket + 512)
    prompt = [(7 * i + 11) % model.config.vocab_size for i in range(args.prompt_tokens)]

    # no request time limit by default: the serve default (300 s from arrival) once ended the streams before a slow
    # prompt's last slices on this 2-core CPU (2026-12-04, 301 s), which then ran with nobody left to wait for them
    engine = Engine(dec, None, shapes, max_waiting=8, batch_buckets=(1, 2, 4, 8), prefill_chunk_tokens=args.chunk,
                    max_request_s=args.max_request_s)
    stamps: list[list[float]] = [[] for _ in range(args.streams)]

    def chunks_alone(n: int, first: int) -> list[float]:
        """One chunk's time, nothing else running: each a ``--chunk``-token prompt of its own."""
        out = []
        for k in range(first, first + n):
            one_chunk = engine.submit([(5 * i + 3 + k) % model.config.vocab_size for i in range(args.chunk)], 1,
                                      stop_ids=())
            one_chunk.done.wait(3600)
            out.append(engine.prefill_units[-1][1])
        return out

    try:
        alone_before = chunks_alone(4, 0)[1:]  # after a warm-up: the first forward's allocations would stretch it
        streams = [engine.submit([3 + i, 4, 5], shapes.max_seq_len - 8, stop_ids=(),  # streaming before, during, after
                                 on_token=lambda _, i=i: stamps[i].append(time.perf_counter()))
                   for i in range(args.streams)]
        while min(len(s) for s in stamps) < 8:  # every stream is decoding
            time.sleep(0.01)
        units_before = len(engine.prefill_units)
        t_arrive = time.perf_counter()
        long_job = engine.submit(prompt, 1, stop_ids=())
        if not long_job.done.wait(3600) or long_job.error is not None:
            raise SystemExit(f"the long prompt failed: {long_job.error}")
        t_done = time.perf_counter()
        streams_alive = all(j.finish_reason is None for j in streams)  # decoding until the prompt was answered
        for j in streams:
            j.cancel()
            j.done.wait(3600)
        slices = list(engine.prefill_units)[units_before:]  # the long prompt's (tokens, seconds), taken before
        engine_chunk_s = engine.prefill_cost.chunk_s(args.chunk)  # the time the engine sized its slices against
        alone_after = chunks_alone(3, 4)  # the after-run chunks add their own units
        chunk_s = statistics.median(alone_before + alone_after)
    finally:
        engine.close()
    during = [b - a for s in stamps for a, b in zip(s, s[1:]) if b >= t_arrive and a <= t_done]
    before = [b - a for s in stamps for a, b in zip(s, s[1:]) if b < t_arrive]
    step_s = statistics.median(before)
    slice_s = [sec for _, sec in slices]

    # The same prompt in one piece, alone (what every stream waited for before chunking)
    t = time.perf_counter()
    cache = dec.new_cache(1, shapes.max_seq_len)
    tokens = torch.tensor([prompt + [0] * (bucket - len(prompt))], device=dec.device)
    dec.prefill(tokens, torch.tensor([len(prompt)], device=dec.device), cache)
    whole_s = time.perf_counter() - t

    doc = {
        "measured_on": f"{'GPU' if dec.device.type == 'cuda' else 'CPU'} ({dec.device.type}), load average "
                       f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores",
        "model": model.config.name, "prompt_tokens": args.prompt_tokens, "chunk_tokens": args.chunk,
        "streams": args.streams,
        "one_chunk_s": chunk_s, "one_chunk_s_before": alone_before, "one_chunk_s_after": alone_after,
        "engine_one_chunk_s": engine_chunk_s,
        "decode_step_s_p50_before": step_s,
        "slices": len(slices), "slice_tokens_min": min(n for n, _ in slices),
        "slice_tokens_max": max(n for n, _ in slices),
        "slice_s_max": max(slice_s), "slice_s_p50": statistics.median(slice_s),
        "stream_gap_s_max_during": max(during), "stream_gap_s_p50_during": statistics.median(during),
        "stream_gap_s_p99_during": statistics.quantiles(during, n=100)[98], "stream_gaps_during": len(during),
        "stream_gaps_over_one_chunk": sum(g > chunk_s for g in during),
        "long_prompt_s": t_done - t_arrive,
        "long_prompt_finish_reason": long_job.finish_reason,
        "serve_request_limit_s": DEFAULT_MAX_REQUEST_S,  # what `edgekit serve` would allow the prompt from arrival
        "engine_request_limit_s": args.max_request_s,  # what this run's engine allowed (None: no limit)
        "streams_decoding_throughout": streams_alive,
        "whole_prompt_prefill_s": whole_s,
        "slice_tokens_and_s": [[n, round(sec, 4)] for n, sec in slices],
    }
    doc["verdict"] = ("PASS" if doc["stream_gap_s_max_during"] <= chunk_s and streams_alive else "FAIL") + \
        f": longest stream pause {max(during) * 1000:.0f} ms <= one chunk's time {chunk_s * 1000:.0f} ms" + \
        ("" if streams_alive else "; but a stream ended before the prompt was answered")
    rows = [("one chunk, alone (median)", chunk_s),
            ("one chunk, alone, before (median)", statistics.median(alone_before)),
            ("one chunk, alone, after (median)", statistics.median(alone_after)),
            ("one chunk, the engine's estimate", engine_chunk_s or float("nan")), ("decode step (p50, before)", step_s),
            ("prompt slice (max)", doc["slice_s_max"]), ("prompt slice (p50)", doc["slice_s_p50"]),
            ("stream pause during (max)", doc["stream_gap_s_max_during"]),
            ("stream pause during (p99)", doc["stream_gap_s_p99_during"]),
            ("stream pause during (p50)", doc["stream_gap_s_p50_during"]),
            ("whole prompt in one piece", whole_s), ("long prompt, arrival to answer", doc["long_prompt_s"])]
    print(f"{args.prompt_tokens}-token prompt during {args.streams} streams, chunks of {args.chunk} tokens, "
          f"{len(slices)} slices of {doc['slice_tokens_min']}-{doc['slice_tokens_max']} tokens "
          f"(measured on the {doc['measured_on']})")
    for name, s in rows:
        print(f"  {name:34} {s * 1000:9.1f} ms")
    print(f"{doc['stream_gaps_over_one_chunk']} of {len(during)} pauses longer than one chunk's time")
    print(f"long prompt under load {doc['long_prompt_s']:.0f} s from arrival to answer; `edgekit serve` ends a request "
          f"{DEFAULT_MAX_REQUEST_S:.0f} s after its arrival (time_limit)"
          + (": this prompt would have been cut" if doc["long_prompt_s"] >= DEFAULT_MAX_REQUEST_S else ""))
    print(doc["verdict"])
    if args.json_path:
        args.json_path.write_text(json.dumps(doc, indent=1))
    return 0 if doc["verdict"].startswith("PASS") else 1


if __name__ == "__main__":
    sys.exit(main())
