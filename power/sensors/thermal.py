"""Temperatures from ``/sys/class/thermal/thermal_zone*``, named by zone type.

Zones are matched by their ``type`` (cpu-thermal, gpu-thermal, tj-thermal, ...),
never by index: the numbering differs between boards and JetPack releases.
Names are shortened to what tegrastats prints (``cpu``, ``gpu``, ``tj``). A zone
whose block is powered off (the CV engines on Orin) reads -256 C and is left out.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from edgekit.power.sample import PowerSample
from edgekit.power.sensors.base import Sensor
from edgekit.power.sensors.sysfs import ValueFile, read_text, resolve_root

# Below this a reading is a "no value" marker, not a temperature (Tegra uses -256 C).
_MIN_VALID_C = -40.0


def zone_name(zone_type: str) -> str:
    """'cpu-thermal' -> 'cpu', 'Tboard_tegra' -> 'tboard_tegra', 'GPU' -> 'gpu'."""
    name = zone_type.strip().lower()
    name = re.sub(r"[-_]thermal$", "", name)
    return name or "zone"


def valid_temp_c(value_c: float) -> bool:
    return value_c > _MIN_VALID_C


class ThermalSensor(Sensor):
    """Every thermal zone's temperature in degrees C."""

    name = "thermal"
    # Tegra thermal zones are polled by the kernel every ~100-1000 ms and temperatures move
    # over seconds: twice a second is enough to catch a limit, and cheap.
    min_interval_s = 0.5

    def __init__(self, root: str | Path | None = None, reopen_s: float = 1.0):
        self.root = resolve_root(root)
        self.reopen_s = reopen_s
        self._zones: list[tuple[str, Path]] | None = None
        self._files: dict[Path, ValueFile] = {}

    @property
    def zones(self) -> list[tuple[str, Path]]:
        if self._zones is None:
            zones = []
            seen: set[str] = set()
            for d in sorted(self.root.glob("class/thermal/thermal_zone*"), key=_zone_index):
                try:
                    name = zone_name(read_text(d / "type"))
                except OSError:
                    continue
                if name in seen:
                    name = f"{name}{_zone_index(d)}"
                seen.add(name)
                zones.append((name, d / "temp"))
            self._zones = zones
        return self._zones

    def available(self) -> bool:
        return bool(self.zones)

    def _read(self, t: float) -> PowerSample:
        if not self.zones:
            return PowerSample.unavailable(self.name, f"no thermal zones under {self.root}", t)
        temps: dict[str, float] = {}
        bad: list[str] = []
        now = time.monotonic()
        for name, path in self.zones:
            f = self._files.get(path) or self._files.setdefault(path, ValueFile(path, self.reopen_s))
            try:
                c = f.read_int(now) / 1000.0  # m°C -> °C
            except (OSError, ValueError):
                bad.append(name)
                continue
            if valid_temp_c(c):
                temps[name] = c
        return PowerSample(t_s=t, source=self.name, temps_c=temps, unreadable=bad,
                           reason=f"unreadable zones: {', '.join(bad)}" if bad else None)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def describe(self) -> str:
        return f"thermal ({', '.join(n for n, _ in self.zones) or 'none'})"


def _zone_index(p: Path) -> int:
    m = re.search(r"(\d+)$", p.name)
    return int(m.group(1)) if m else 0
