"""Tegra (integrated) GPU load and clock from sysfs.

The load file holds per-mille (0-1000). Its path moved between JetPack
releases, so several known places are tried in order; the first that exists
wins. The clock comes from the GPU's devfreq node (Hz), and so does its ceiling
(``max_freq``, which nvpmodel sets for the power mode): a busy GPU clocked below
that ceiling is being throttled (the policy's clock rule).
"""

from __future__ import annotations

import time
from pathlib import Path

from edgekit.power.sample import PowerSample
from edgekit.power.sensors.base import Sensor
from edgekit.power.sensors.sysfs import ValueFile, resolve_root

LOAD_PATHS = (
    "devices/platform/gpu.0/load",
    "devices/gpu.0/load",
    "devices/platform/bus@0/17000000.gpu/load",
    "devices/platform/17000000.ga10b/load",
    "devices/17000000.ga10b/load",
    "class/devfreq/17000000.ga10b/device/load",
    "class/devfreq/17000000.gpu/device/load",
)
FREQ_PATHS = (
    "class/devfreq/17000000.ga10b/cur_freq",
    "class/devfreq/17000000.gpu/cur_freq",
)


def _first_existing(root: Path, candidates: tuple[str, ...]) -> Path | None:
    for rel in candidates:
        p = root / rel
        if p.exists():
            return p
    return None


class TegraGpuLoadSensor(Sensor):
    name = "gpu_load"
    # The driver reports load averaged over its own window; 10 Hz follows a load change
    # well enough for a monitor, and every read costs the inference process CPU.
    min_interval_s = 0.1

    def __init__(self, root: str | Path | None = None, reopen_s: float = 1.0):
        self.root = resolve_root(root)
        self.load_path = _first_existing(self.root, LOAD_PATHS)
        self.freq_path = _first_existing(self.root, FREQ_PATHS)
        self._load = ValueFile(self.load_path, reopen_s) if self.load_path else None
        self._freq = ValueFile(self.freq_path, reopen_s) if self.freq_path else None
        max_path = self.freq_path.with_name("max_freq") if self.freq_path else None
        self._max_freq = ValueFile(max_path, reopen_s) if max_path is not None and max_path.exists() else None

    def available(self) -> bool:
        return self.load_path is not None

    def _read(self, t: float) -> PowerSample:
        if self.load_path is None:
            return PowerSample.unavailable(self.name, f"no Tegra GPU load file under {self.root}", t)
        now = time.monotonic()
        load_pct = self._load.read_int(now) / 10.0  # per-mille -> %
        freq, max_freq = _mhz(self._freq, now), _mhz(self._max_freq, now)
        return PowerSample(t_s=t, source=self.name, gpu_load_pct=load_pct, gpu_freq_mhz=freq, gpu_max_freq_mhz=max_freq)

    def close(self) -> None:
        for f in (self._load, self._freq, self._max_freq):
            if f is not None:
                f.close()

    def describe(self) -> str:
        return f"gpu_load ({self.load_path})" if self.load_path else "gpu_load (absent)"


def _mhz(f: ValueFile | None, now: float) -> float | None:
    if f is None:
        return None
    try:
        return f.read_int(now) / 1e6  # Hz -> MHz
    except (OSError, ValueError):
        return None
