"""Temperatures from ``/sys/class/thermal/thermal_zone*``, named by zone type.

Zones are matched by their ``type`` (cpu-thermal, gpu-thermal, tj-thermal, ...),
never by index: the numbering differs between boards and JetPack releases.
Names are shortened to what tegrastats prints (``cpu``, ``gpu``, ``tj``). A zone
whose block is powered off (the CV engines on Orin) reads -256 C and is left out.

Each zone's throttling trip points (``trip_point_N_type`` passive, hot or
critical, ``trip_point_N_temp`` in m°C) are read once; a zone at or above one is
reported in ``trips`` with the trip's type and temperature -- the kernel is
throttling (passive) or about to shut down (critical) there. ``active`` trips
only start a fan and are not throttling, so they are not reported.
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
    """'cpu-thermal' -> 'cpu', 'CPU-therm' -> 'cpu', 'Tboard_tegra' -> 'tboard_tegra', 'GPU' -> 'gpu'."""
    name = zone_type.strip().lower()
    name = re.sub(r"[-_]therm(?:al)?$", "", name)  # "cpu-thermal" (JetPack 5+), "CPU-therm" (JetPack 4)
    return name or "zone"


def valid_temp_c(value_c: float) -> bool:
    return value_c > _MIN_VALID_C


# Zones that report a fixed number, not a measurement. On JetPack 4 boards (Nano, TX1/TX2,
# Xavier) the PMIC zone ("PMIC-Die" in sysfs, "PMIC@100C" in tegrastats) reads 100 C at idle
# while every real zone sits at 25-45 C: alarming on it would raise a critical event on every
# sample. Matched by name prefix and exact value, so a real reading of another value still counts.
PLACEHOLDER_TEMPS_C = {"pmic": 100.0}


def is_placeholder_temp(zone: str, value_c: float) -> bool:
    return any(zone.startswith(prefix) and value_c == v for prefix, v in PLACEHOLDER_TEMPS_C.items())


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
        self._trips: dict[str, list[tuple[str, float]]] = {}  # zone -> [(type, °C)], lowest first
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
                trips = _throttle_trips(d)
                if trips:
                    self._trips[name] = trips
            self._zones = zones
        return self._zones

    def available(self) -> bool:
        return bool(self.zones)

    def _read(self, t: float) -> PowerSample:
        if not self.zones:
            return PowerSample.unavailable(self.name, f"no thermal zones under {self.root}", t)
        temps: dict[str, float] = {}
        placeholders: dict[str, float] = {}
        trips: dict[str, dict] = {}
        bad: list[str] = []
        now = time.monotonic()
        for name, path in self.zones:
            f = self._files.get(path) or self._files.setdefault(path, ValueFile(path, self.reopen_s))
            try:
                c = f.read_int(now) / 1000.0  # m°C -> °C
            except (OSError, ValueError):
                bad.append(name)
                continue
            if is_placeholder_temp(name, c):
                placeholders[name] = c
            elif valid_temp_c(c):
                temps[name] = c
                for kind, trip_c in reversed(self._trips.get(name, ())):
                    if c >= trip_c:  # the highest trip reached
                        trips[name] = {"type": kind, "trip_c": trip_c, "temp_c": c}
                        break
        return PowerSample(t_s=t, source=self.name, temps_c=temps, placeholder_temps_c=placeholders, trips=trips, unreadable=bad,
                           reason=f"unreadable zones: {', '.join(bad)}" if bad else None)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def describe(self) -> str:
        return f"thermal ({', '.join(n for n, _ in self.zones) or 'none'})"


_THROTTLE_TRIP_TYPES = ("passive", "hot", "critical")


def _throttle_trips(zone_dir: Path) -> list[tuple[str, float]]:
    """[(type, °C)] of a zone's passive/hot/critical trip points, lowest temperature first."""
    out = []
    for type_file in zone_dir.glob("trip_point_*_type"):
        try:
            kind = read_text(type_file).lower()
            if kind in _THROTTLE_TRIP_TYPES:
                temp_file = type_file.with_name(type_file.name.replace("_type", "_temp"))
                out.append((kind, int(read_text(temp_file)) / 1000.0))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda x: x[1])


def _zone_index(p: Path) -> int:
    m = re.search(r"(\d+)$", p.name)
    return int(m.group(1)) if m else 0
