#!/usr/bin/env python3
"""Overhead of the watchdog on a CPU inference loop (measured on CPU).

edgekit's own decoder (a preset: random weights, real shapes) generates tokens
in one long stream while the watchdog is switched on and off in alternating
blocks of --block tokens (OFF, ON, OFF, ON, ...):

  OFF  plain generation; the watchdog thread exists but is paused (blocked, no CPU)
  ON   every token is timed into a LatencyTracker and the watchdog thread runs
       at its fast rate (forced, default 1 kHz), reading the local sensors and,
       by default, a recorded Orin Nano tree with INA3221 rails, thermal zones with
       trip points, GPU load and clock ceiling and the soctherm_oc counters (every
       sysfs sensor and throttle rule the watchdog has)

Alternating every few tokens (A/B/A/B at fine grain) puts both arms under the
same machine load, which on a shared machine drifts far more than 1 % between
whole runs. The first token of each block is dropped (the switch itself).
The headline throughput ratio ON/OFF is the median over adjacent (OFF, ON)
block pairs of OFF median token time / ON median token time, with a bootstrap
90 % interval; the ratio of the arms' overall medians and trimmed means are
printed beside it, and OFF-vs-next-OFF block pairs give the noise floor.
Goal: ratio >= 0.99 (<= 1 % loss).

    python scripts/bench_watchdog.py --tokens 600 --json out.json
    python scripts/bench_watchdog.py --model preset:tiny --tokens 3000   # Python-bound decode: worst case for the GIL
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path


def _trimmed_mean(xs: list[float], frac: float = 0.2) -> float:
    xs = sorted(xs)
    k = int(len(xs) * frac)
    core = xs[k: len(xs) - k] or xs
    return sum(core) / len(core)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="preset:smollm2-135m", help="a preset (random weights) or a model path")
    ap.add_argument("--tokens", type=int, default=600, help="tokens to time in all (both arms)")
    ap.add_argument("--block", type=int, default=8, help="tokens per OFF/ON block")
    ap.add_argument("--context", type=int, default=256, help="KV cache length; the stream restarts when it is full")
    ap.add_argument("--fast-hz", type=float, default=1000.0)
    ap.add_argument("--sysfs-root", default=str(Path(__file__).resolve().parents[1] / "tests/power/fixtures/sysfs/orin-nano-super-oc"),
                    help="a sysfs tree for the INA3221/thermal/GPU-load sensors ('' for this machine's own sensors only)")
    ap.add_argument("--sensors", default="all", help="'all' (the tree's sensors + this machine's), 'none' (latency only), or a comma list")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (0: torch's default). 1 by default: on a small shared machine two "
                         "spinning OpenMP threads collapse under outside load and drown the effect being measured")
    ap.add_argument("--json", dest="json_path", default=None, help="write the result here")
    args = ap.parse_args()

    import torch

    from edgekit.generate import Generator
    from edgekit.model.loader import load_model
    from edgekit.power.latency import LatencyTracker
    from edgekit.power.policy import PolicyConfig
    from edgekit.power.sampler import AdaptiveSampler
    from edgekit.power.sensors.discover import local_sensors
    from edgekit.power.sensors.power_mode import describe_power_mode, read_power_mode
    from edgekit.power.watchdog import Watchdog
    from edgekit.shapes import StaticShapes

    if args.threads:
        torch.set_num_threads(args.threads)
    m = load_model(args.model, tokenizer=False)
    gen = Generator(m.decoder(), StaticShapes.for_context(args.context), pad_token_id=0)
    prompt = [(i * 7919) % m.config.vocab_size for i in range(1, 17)]
    per_stream = args.context - 32 - 1  # prompt bucket 32 + new tokens fit the cache

    load_at_start = os.getloadavg()[0]
    power_mode = read_power_mode()  # this machine's nvpmodel mode where it has one (a Jetson), else None
    sensors, absent = local_sensors()
    if args.sysfs_root:
        tree, _ = local_sensors(args.sysfs_root)
        sensors = tree + [s for s in sensors if s.name not in {t.name for t in tree}]
    if args.sensors == "none":
        sensors = []
    elif args.sensors != "all":
        keep = set(args.sensors.split(","))
        sensors = [s for s in sensors if s.name in keep]
    tracker = LatencyTracker()
    wd = Watchdog(tracker, sensors, PolicyConfig(), sampler=AdaptiveSampler(fast_hz=args.fast_hz, force="fast"))
    wd.pause()
    wd.start()

    def tokens():
        while True:
            yield from gen.stream(prompt, per_stream)

    # warm-up: allocator, caches, thread pool, both arms once
    stream = tokens()
    for _ in range(2 * args.block):
        next(stream)

    times = {"off": [], "on": []}
    cpu_times = {"off": [], "on": []}  # the inference thread's own CPU time per token
    blocks: list[tuple[str, float]] = []  # (arm, median token time of the block)
    on_cpu_s = on_wall_s = 0.0
    n_blocks = max(2, args.tokens // args.block)
    n_blocks += n_blocks % 2
    for b in range(n_blocks):
        arm = "on" if b % 2 else "off"
        if arm == "on":
            wd.resume()
            cpu0, wall0 = wd.cpu_s, time.monotonic()
        block_times = []
        last = time.perf_counter()
        last_cpu = time.thread_time()
        for i in range(args.block):
            next(stream)
            now, now_cpu = time.perf_counter(), time.thread_time()
            dt, dcpu = now - last, now_cpu - last_cpu
            last, last_cpu = now, now_cpu
            if arm == "on":
                tracker.record("token", dt * 1000.0)
            if i > 0:  # the first token of a block straddles the switch
                block_times.append(dt)
                cpu_times[arm].append(dcpu)
        if arm == "on":
            wd.pause()
            on_cpu_s += wd.cpu_s - cpu0
            on_wall_s += time.monotonic() - wall0
        times[arm] += block_times
        blocks.append((arm, statistics.median(block_times)))
        if (b + 1) % 20 == 0:
            print(f"  {b + 1}/{n_blocks} blocks", flush=True)
    wd.stop()

    off_med, on_med = statistics.median(times["off"]), statistics.median(times["on"])
    pairs = [off / on for (a1, off), (a2, on) in zip(blocks[0::2], blocks[1::2])]
    noise = [o2 / o1 for (_, o1), (_, o2) in zip(blocks[0::2], blocks[2::2])]
    q = statistics.quantiles(pairs, n=4) if len(pairs) >= 4 else [min(pairs), statistics.median(pairs), max(pairs)]
    out = {
        "measured_on": "cpu",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "python": sys.version.split()[0], "torch": torch.__version__, "loadavg_1m_at_start": load_at_start,
                    "loadavg_1m_at_end": os.getloadavg()[0], "power_mode": power_mode},
        "model": args.model,
        "tokens_timed": {"off": len(times["off"]), "on": len(times["on"])},
        "block_tokens": args.block,
        "watchdog": {"fast_hz": args.fast_hz, "sensor_selection": args.sensors, "sensors": [s.describe() for s in sensors], "absent": absent,
                     "ticks": wd.ticks, "achieved_tick_hz": wd.ticks / on_wall_s if on_wall_s else 0.0,
                     "thread_cpu_pct_of_one_core": 100.0 * on_cpu_s / on_wall_s if on_wall_s else 0.0},
        "off_tok_s_from_median": 1.0 / off_med,
        "on_tok_s_from_median": 1.0 / on_med,
        "ratio_on_over_off_medians": off_med / on_med,
        "ratio_on_over_off_trimmed_means": _trimmed_mean(times["off"]) / _trimmed_mean(times["on"]),
        "ratio_per_block_pair_median": statistics.median(pairs),
        # CPU time of the inference thread per token: blind to time spent descheduled (other
        # processes, GIL waits), sensitive to what the watchdog does to its caches
        "ratio_inference_thread_cpu_medians": statistics.median(cpu_times["off"]) / statistics.median(cpu_times["on"]),
        "ratio_per_block_pair_iqr": [q[0], q[-1]],
        "noise_off_vs_off_block_ratio_iqr": (lambda qq: [qq[0], qq[-1]])(statistics.quantiles(noise, n=4)) if len(noise) >= 4 else None,
        "goal": "ratio >= 0.99 (<= 1 % throughput loss)",
    }
    # The headline is the median of the paired (adjacent OFF, ON) block ratios: pairs are
    # seconds apart, so drift in machine load cancels; a bootstrap gives its 90 % interval.
    rng = random.Random(0)
    boot = sorted(statistics.median(rng.choices(pairs, k=len(pairs))) for _ in range(1000))
    out["ratio_per_block_pair_median_ci90"] = [boot[50], boot[949]]
    out["throughput_loss_pct"] = 100.0 * (1.0 - out["ratio_per_block_pair_median"])
    out["meets_goal"] = out["ratio_per_block_pair_median"] >= 0.99
    w = out["watchdog"]
    print()
    print(f"{'arm':<36}{'tok/s (from median token time)':>32}")
    print(f"{'OFF (watchdog paused)':<36}{out['off_tok_s_from_median']:>32.2f}")
    print(f"{'ON  (watchdog @ %g Hz + tracker)' % args.fast_hz:<36}{out['on_tok_s_from_median']:>32.2f}")
    ci = out["ratio_per_block_pair_median_ci90"]
    print(f"throughput ratio ON/OFF (median of paired blocks): {out['ratio_per_block_pair_median']:.4f}, 90 % CI "
          f"[{ci[0]:.4f}, {ci[1]:.4f}], block IQR [{out['ratio_per_block_pair_iqr'][0]:.3f}, {out['ratio_per_block_pair_iqr'][1]:.3f}]")
    print(f"  other estimators: ratio of medians {out['ratio_on_over_off_medians']:.4f}, of trimmed means "
          f"{out['ratio_on_over_off_trimmed_means']:.4f}; inference-thread CPU per token OFF/ON {out['ratio_inference_thread_cpu_medians']:.4f}")
    if out["noise_off_vs_off_block_ratio_iqr"]:
        lo, hi = out["noise_off_vs_off_block_ratio_iqr"]
        print(f"noise floor: OFF-vs-next-OFF block ratio IQR [{lo:.3f}, {hi:.3f}]")
    print(f"loss {out['throughput_loss_pct']:.2f} % (goal <= 1 %); watchdog ran at {w['achieved_tick_hz']:.0f} ticks/s using "
          f"{w['thread_cpu_pct_of_one_core']:.2f} % of one core; {args.model}, measured on CPU ({os.cpu_count()} cores, "
          f"load {load_at_start:.1f} at start, {out['machine']['loadavg_1m_at_end']:.1f} at end; "
          f"power mode {describe_power_mode(power_mode)})")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
