#!/usr/bin/env python3
"""Does the NVML sensor follow a real load? (run on the GPU machine; measured on GPU)

Samples the GPU's power through edgekit's NvmlSensor every --period-ms while
the GPU is idle, then while a loop of torch fp16 matmuls keeps it busy, then
idle again. Reports:

  * the power step: mean power under load minus mean idle power (the 1 s NVML
    average lags a step by about a second, so the first --settle-s of each
    phase is left out of its mean; the instantaneous field, where the driver
    has it, is reported beside it);
  * the energy check: the NVML energy counter's increase over the run against
    the integral (trapezoid) of the sampled power over the same time, for both
    the averaged and the instantaneous power; they should agree within ~10 %.

Prints a table and writes JSON to --json (default $OUT/gpu_power_check.json
when $OUT is set). Exit code 1 when a check fails.

    python tools/gpu_power_check.py --json $OUT/gpu_power_check.json
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
    ap.add_argument("--index", type=int, default=0, help="GPU index (NVML and torch)")
    ap.add_argument("--idle-s", type=float, default=4.0)
    ap.add_argument("--load-s", type=float, default=5.0)
    ap.add_argument("--cool-s", type=float, default=3.0)
    ap.add_argument("--settle-s", type=float, default=1.5, help="left out at the start of each phase's mean (NVML's 1 s average ramps)")
    ap.add_argument("--period-ms", type=float, default=20.0)
    ap.add_argument("--n", type=int, default=8192, help="matmul size n x n x n (fp16)")
    ap.add_argument("--min-step-w", type=float, default=50.0, help="the load must raise power by at least this")
    ap.add_argument("--energy-tolerance", type=float, default=0.10, help="allowed |integral/counter - 1|")
    ap.add_argument("--json", dest="json_path", default=None)
    args = ap.parse_args()

    import torch

    from edgekit.power.sensors.nvml import NvmlSensor

    if not torch.cuda.is_available():
        print("no CUDA GPU here: run this on the GPU machine", file=sys.stderr)
        return 2
    sensor = NvmlSensor([args.index])
    first = sensor.read()
    if not first.available:
        print(f"NVML sensor unavailable: {first.reason}", file=sys.stderr)
        return 2
    dev = torch.device("cuda", args.index)

    samples: list[dict] = []
    phase = {"name": "idle"}
    stop = threading.Event()

    def sampler() -> None:
        period = args.period_ms / 1000.0
        nxt = time.monotonic()
        while not stop.is_set():
            t = time.monotonic()
            s = sensor.read()
            if s.available:
                key = f"GPU{args.index}"
                samples.append({"t": t, "phase": phase["name"], "avg_mw": s.rails_mw.get(key),
                                "instant_mw": s.rails_mw.get(f"{key}_instant"), "energy_mj": s.energy_mj,
                                "util_pct": s.gpu_load_pct, "temp_c": s.temps_c.get(key.lower())})
            nxt += period
            time.sleep(max(0.0, nxt - time.monotonic()))

    a = torch.randn(args.n, args.n, device=dev, dtype=torch.float16)  # (n, n)
    b = torch.randn(args.n, args.n, device=dev, dtype=torch.float16)  # (n, n)
    torch.cuda.synchronize(dev)
    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    time.sleep(args.idle_s)

    phase["name"] = "load"
    t_load0 = time.monotonic()
    iters = 0
    while time.monotonic() - t_load0 < args.load_s:
        for _ in range(8):
            c = a @ b  # (n, n), fp16 tensor cores
            iters += 1
        torch.cuda.synchronize(dev)  # keep the queue short so the phase ends on time
    load_wall_s = time.monotonic() - t_load0
    del c
    phase["name"] = "cool"
    time.sleep(args.cool_s)
    stop.set()
    th.join()
    sensor.close()

    out = analyse(samples, args, gpu=torch.cuda.get_device_name(dev), iters=iters, load_wall_s=load_wall_s)
    e = out["energy"]
    counter_j = e["counter_j"]
    int_avg, int_inst = e["integral_of_avg_power_j"], e["integral_of_instant_power_j"]
    tflops = out["load"]["tflops"]
    checks = {
        "power_step_seen": out["step_w"] is not None and out["step_w"] >= args.min_step_w,
        "energy_counter_present": counter_j is not None and counter_j > 0,
        "energy_integral_consistent": any(
            r is not None and abs(r - 1.0) <= args.energy_tolerance
            for r in (e["ratio_avg_integral_over_counter"], e["ratio_instant_integral_over_counter"])),
    }
    out["checks"] = checks
    out["ok"] = all(checks.values())

    def w(x):
        return "-" if x is None else f"{x:8.1f}"

    print(f"NVML power on {out['gpu']} (measured on GPU), {len(samples)} samples at {out['achieved_sample_hz']:.0f} Hz")
    print(f"{'phase':<8}{'avg power W':>14}{'instant W':>12}")
    for ph in ("idle", "load", "cool"):
        print(f"{ph:<8}{w(out['power_avg_w'][ph]):>14}{w(out['power_instant_w'].get(ph)):>12}")
    print(f"{'step':<8}{w(out['step_w']):>14}{w(out['step_instant_w']):>12}   (load: {tflops:.0f} TFLOP/s fp16, {iters} matmuls)")
    print(f"energy over {w(e['window_s'])} s: counter {w(counter_j)} J, integral of avg power {w(int_avg)} J "
          f"(ratio {e['ratio_avg_integral_over_counter'] or float('nan'):.3f}), of instant power {w(int_inst)} J "
          f"(ratio {e['ratio_instant_integral_over_counter'] or float('nan'):.3f})")
    print("checks: " + ", ".join(f"{k}={'PASS' if v else 'FAIL'}" for k, v in checks.items()))

    path = args.json_path or (str(Path(os.environ["OUT"]) / "gpu_power_check.json") if os.environ.get("OUT") else None)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {path}")
    return 0 if out["ok"] else 1


def analyse(samples: list[dict], args, gpu: str, iters: int, load_wall_s: float) -> dict:
    """Phase means, the power step and the energy check from the sampled rows (pure; no GPU needed)."""
    def mean_of(ph: str, key: str) -> float | None:
        t0 = min((s["t"] for s in samples if s["phase"] == ph), default=None)
        vals = [s[key] for s in samples if s["phase"] == ph and s[key] is not None and s["t"] - t0 >= args.settle_s]
        return statistics.fmean(vals) / 1000.0 if vals else None

    def integral_j(rows: list[dict], key: str) -> float | None:
        pts = [(s["t"], s[key]) for s in rows if s[key] is not None]
        if len(pts) < 2:
            return None
        return sum((t2 - t1) * (p1 + p2) / 2 for (t1, p1), (t2, p2) in zip(pts, pts[1:])) / 1000.0  # mW*s -> J

    with_energy = [s for s in samples if s["energy_mj"] is not None]
    counter_j = (with_energy[-1]["energy_mj"] - with_energy[0]["energy_mj"]) / 1000.0 if len(with_energy) >= 2 else None
    span = (with_energy[0]["t"], with_energy[-1]["t"]) if len(with_energy) >= 2 else None
    # integrate over exactly the span the counter covers
    in_span = [s for s in samples if span and span[0] <= s["t"] <= span[1]]
    int_avg, int_inst = integral_j(in_span, "avg_mw"), integral_j(in_span, "instant_mw")

    idle_w, load_w, cool_w = (mean_of(p, "avg_mw") for p in ("idle", "load", "cool"))
    idle_i, load_i = mean_of("idle", "instant_mw"), mean_of("load", "instant_mw")
    tflops = 2 * args.n**3 * iters / load_wall_s / 1e12
    out = {
        "measured_on": "gpu",
        "gpu": gpu,
        "sensor": "NVML via edgekit.power.sensors.nvml.NvmlSensor",
        "period_ms": args.period_ms,
        "samples": len(samples),
        "achieved_sample_hz": len(samples) / (samples[-1]["t"] - samples[0]["t"]) if len(samples) > 1 else 0.0,
        "power_avg_w": {"idle": idle_w, "load": load_w, "cool": cool_w},
        "power_instant_w": {"idle": idle_i, "load": load_i},
        "step_w": (load_w - idle_w) if (load_w is not None and idle_w is not None) else None,
        "step_instant_w": (load_i - idle_i) if (load_i is not None and idle_i is not None) else None,
        "load": {"matmul": f"fp16 {args.n}x{args.n}x{args.n}", "iterations": iters, "seconds": load_wall_s, "tflops": tflops},
        "energy": {
            "window_s": (span[1] - span[0]) if span else None,
            "counter_j": counter_j,
            "integral_of_avg_power_j": int_avg,
            "integral_of_instant_power_j": int_inst,
            "ratio_avg_integral_over_counter": (int_avg / counter_j) if (int_avg and counter_j) else None,
            "ratio_instant_integral_over_counter": (int_inst / counter_j) if (int_inst and counter_j) else None,
        },
        "utilisation_pct_load_mean": statistics.fmean([s["util_pct"] for s in samples if s["phase"] == "load" and s["util_pct"] is not None] or [0]),
        "temperature_c_max": max((s["temp_c"] for s in samples if s["temp_c"] is not None), default=None),
        "trace": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in s.items()} for s in samples],
    }
    return out


if __name__ == "__main__":
    raise SystemExit(main())
