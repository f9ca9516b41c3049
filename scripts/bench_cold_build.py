#!/usr/bin/env python3
"""Time a cold `edgekit build` of the default model for orin on this machine (CPU only).

Cold: EDGEKIT_CACHE_DIR and TRITON_CACHE_DIR point at empty temporary folders, so every stage
(model intake, plan compiles, the quantization gate and its FP reference, golden vectors, ONNX)
is computed. The machine may be shared: the 1-minute load average is sampled every few seconds
during the run and reported with the times, with the CPU time the build used (wall time on an
idle machine is bounded by it). Prints a table, then JSON (--json-out FILE also writes it).

    python scripts/bench_cold_build.py [--target orin] [--json-out cold_build.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def _load1() -> float:
    return os.getloadavg()[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="orin")
    ap.add_argument("--model", default=None, help="default: the default model")
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        env = {**os.environ, "EDGEKIT_CACHE_DIR": str(d / "edgekit-cache"), "TRITON_CACHE_DIR": str(d / "triton-cache")}
        cmd = [sys.executable, "-m", "edgekit", "build", *([args.model] if args.model else []), "--target", args.target,
               "--dev-key", "-o", str(d / "bundle"), "--json"]
        samples, stop = [_load1()], threading.Event()

        def sample() -> None:
            while not stop.wait(5.0):
                samples.append(_load1())

        threading.Thread(target=sample, daemon=True).start()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        stop.set()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if r.returncode != 0:
            sys.stderr.write(r.stderr[-4000:])
            return r.returncode
        summary = json.loads(r.stdout)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    doc = {
        "measured_on": f"cpu: this machine ({os.cpu_count()} cores), shared; no GPU involved",
        "command": " ".join(["edgekit", *cmd[3:]]),
        "cold": "EDGEKIT_CACHE_DIR and TRITON_CACHE_DIR empty",
        "wall_s": round(wall, 1),
        "build_seconds_reported": summary.get("build_seconds"),
        "cpu_s": round(cpu_s, 1),
        "cpu_share": round(cpu_s / wall / (os.cpu_count() or 1), 2),
        "load_avg_1min": {"start": samples[0], "max": max(samples), "mean": round(sum(samples) / len(samples), 2)},
        "stage_seconds": summary.get("stage_seconds"),
        "cache_misses": summary.get("cache", {}).get("misses"),
        "gate_passed": (summary.get("quantization") or {}).get("gate", {}).get("passed"),
    }
    print(f"cold build of {summary['model']['name'] if isinstance(summary.get('model'), dict) else 'the model'} for {args.target} "
          f"(measured on this machine's CPU, shared: load average {doc['load_avg_1min']['start']:.1f} at start, "
          f"max {doc['load_avg_1min']['max']:.1f})")
    print(f"{'stage':<10} {'seconds':>8}")
    for k, v in (doc["stage_seconds"] or {}).items():
        print(f"{k:<10} {v:>8.1f}")
    print(f"{'wall':<10} {doc['wall_s']:>8.1f}   cpu {doc['cpu_s']:.1f} s ({100 * doc['cpu_share']:.0f}% of the machine)")
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
