"""Where a decode step's time goes: kernel time against wall time, per kernel name.

The bench says how fast a step is; this says why. Under CUDA-graph replay the
host is out of the way, so a step's wall time is the sum of its kernels'
times plus the gaps between them (each kernel's launch latency and drain
inside the graph). ``torch.profiler`` (CUPTI) records every kernel a graph
replay runs; summing their durations per token and comparing with the wall
time splits the step into "inside kernels" and "between kernels".

With programmatic dependent launch (kernels/pdl_triton.py, sm_90+) a kernel
starts before the previous one ends and its programs wait inside it: kernel
times then overlap, include that wait, and "between kernels" comes out
negative (the overlap). Read wall time and kernel counts for such a step.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from edgekit.bench.measure import timed


def _device_events(prof) -> list:
    out = []
    for e in prof.events():
        dt = getattr(e, "device_type", None)
        if dt is not None and "CUDA" in str(dt):
            out.append(e)
    return out


def profile_decode(engine, first: torch.Tensor, start_pos: int, n: int, top: int = 12) -> dict:
    """Kernel count, kernel time and wall time per token of ``engine.decode`` (n tokens), plus the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    dev = engine.device
    engine.decode(first, start_pos, n)  # warm
    _, wall = timed(lambda: engine.decode(first, start_pos, n), dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.decode(first, start_pos, n)
        torch.cuda.synchronize(dev)
    events = _device_events(prof)
    by_name: dict[str, list[float]] = defaultdict(list)
    for e in events:
        by_name[e.name].append(e.time_range.elapsed_us())
    total_us = sum(sum(v) for v in by_name.values())
    span_us = (max(e.time_range.end for e in events) - min(e.time_range.start for e in events)) if events else 0.0
    rows = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
    return {
        "tokens": n,
        "wall_ms_per_token": 1000 * wall / n,
        "kernel_ms_per_token": total_us / 1000 / n,
        "profiled_span_ms_per_token": span_us / 1000 / n,
        "kernels_per_token": len(events) / n,
        "between_kernels_ms_per_token": (span_us - total_us) / 1000 / n if events else None,
        "top_kernels": [
            {"name": name[:90], "per_token": len(v) / n, "us_per_token": sum(v) / n, "avg_us": sum(v) / len(v)}
            for name, v in rows[:top]
        ],
    }
