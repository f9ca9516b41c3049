"""A simulated board run for report and CLI tests: a recorded Orin NX tree whose VDD_IN
current is rewritten over time (a load step), plus token latencies with two injected
spikes, driven through the real Watchdog.tick on a simulated clock (no sleeping)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from edgekit.power.jsonl import JsonlLogger
from edgekit.power.latency import LatencyTracker
from edgekit.power.policy import PolicyConfig
from edgekit.power.sampler import AdaptiveSampler
from edgekit.power.sensors.hwmon_ina3221 import Ina3221Sensor
from edgekit.power.sensors.thermal import ThermalSensor
from edgekit.power.watchdog import Watchdog

SYSFS = Path(__file__).parent / "fixtures" / "sysfs"
T0_WALL = 1_760_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def simulate_run(tmp: Path, seconds: float = 20.0, spikes_at_s=(6.0, 14.0), step_s=(9.0, 13.0),
                 tokens_per_request: int | None = None) -> Path:
    """``tokens_per_request``: also end a request every that many tokens (its time to first token and its whole
    latency recorded, as the server does)."""
    board = tmp / "board"
    shutil.copytree(SYSFS / "orin-nx-16gb", board)
    hw = board / "bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1"
    tj = board / "class/thermal/thermal_zone0/temp"
    clock = Clock()
    tracker = LatencyTracker(window_s=5.0, clock=clock)
    log = tmp / "run.jsonl"
    wd = Watchdog(tracker, [Ina3221Sensor(board), ThermalSensor(board)],
                  PolicyConfig(power_target_w=6.0, power_sustain_s=0.5, min_samples=20, window_s=5.0),
                  logger=JsonlLogger(log), sampler=AdaptiveSampler(clock=clock), log_interval_s=0.1)
    wd.write_meta(source="simulated orin-nx-16gb")
    rng = random.Random(0)
    dt = 0.01  # a token every 10 ms, a watchdog tick every 10 ms
    pending = list(spikes_at_s)
    steps = int(seconds / dt)
    for i in range(steps):
        clock.t = 1000.0 + i * dt
        sim_s = i * dt
        value = 9.0 + rng.gauss(0, 0.25) + (1.5 if step_s[0] <= sim_s < step_s[1] else 0.0)
        if pending and sim_s >= pending[0]:
            value, pending = 38.0, pending[1:]
        tracker.record("token", value)
        if tokens_per_request and i % tokens_per_request == tokens_per_request - 1:
            tracker.record("ttft", 30.0 + rng.gauss(0, 1.0))
            tracker.record("request", 30.0 + tokens_per_request * 9.0 + rng.gauss(0, 5.0))
        if i % 10 == 0:  # the "hardware" changes every 100 ms
            ma = 2200 if step_s[0] <= sim_s < step_s[1] else 844 + rng.randint(-20, 20)
            (hw / "curr1_input").write_text(f"{ma}\n")
            (hw / "curr2_input").write_text(f"{(1100 if ma > 2000 else 102) + rng.randint(-5, 5)}\n")
            tj.write_text(f"{int((45.3 + (sim_s - step_s[0]) * 2.0 if sim_s >= step_s[0] else 45.3) * 1000)}\n")
        wd.tick(now_mono=clock.t, now_wall=T0_WALL + sim_s)
    wd.stop()
    return log
