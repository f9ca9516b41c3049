"""Tegra (integrated) GPU load and clock from sysfs.

The load file holds per-mille (0-1000). Its path moved between JetPack
releases, so several known places are tried in order; the first that exists
wins. The clock comes from the GPU's devfreq node (Hz).
"""

from __future__ import annotations

from pathlib import Path

from edgekit.power.sample import PowerSample
from edgekit.power.sensors.base import Sensor
from edgekit.power.sensors.sysfs import read_int, resolve_root

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
    # The driver averages load over its own window (tens of ms); reading faster buys nothing.
    min_interval_s = 0.02

    def __init__(self, root: str | Path | None = None):
        self.root = resolve_root(root)
        self.load_path = _first_existing(self.root, LOAD_PATHS)
        self.freq_path = _first_existing(self.root, FREQ_PATHS)

    def available(self) -> bool:
        return self.load_path is not None

    def _read(self, t: float) -> PowerSample:
        if self.load_path is None:
            return PowerSample.unavailable(self.name, f"no Tegra GPU load file under {self.root}", t)
        load_pct = read_int(self.load_path) / 10.0  # per-mille -> %
        freq = None
        if self.freq_path is not None:
            try:
                freq = read_int(self.freq_path) / 1e6  # Hz -> MHz
            except (OSError, ValueError):
                freq = None
        return PowerSample(t_s=t, source=self.name, gpu_load_pct=load_pct, gpu_freq_mhz=freq)

    def describe(self) -> str:
        return f"gpu_load ({self.load_path})" if self.load_path else "gpu_load (absent)"
