"""Intel/AMD CPU package power from the powercap RAPL energy counters.

``/sys/class/powercap/intel-rapl:N/energy_uj`` is a cumulative µJ counter that
wraps at ``max_energy_range_uj``; power is the difference of two reads over
their time apart, so the first read only primes the counter. The files are
often readable by root only: then the sensor is unavailable, not an error.
"""

from __future__ import annotations

import time
from pathlib import Path

from edgekit.power.sample import PowerSample, set_power_totals
from edgekit.power.sensors.base import Sensor
from edgekit.power.sensors.sysfs import read_int, read_text, resolve_root


def wrapped_delta(now: int, before: int, max_range: int) -> int:
    """Counter difference that survives one wrap at max_range."""
    d = now - before
    return d + max_range if d < 0 and max_range > 0 else d


class RaplSensor(Sensor):
    name = "rapl"
    # The counter's resolution is ~15 µJ at a ~1 ms update; below ~10 ms the quotient is noise.
    min_interval_s = 0.01

    def __init__(self, root: str | Path | None = None, clock=time.monotonic):
        self.root = resolve_root(root)
        self.clock = clock
        # top-level packages only (intel-rapl:0, :1); sub-zones (intel-rapl:0:0) are inside them
        self.zones: list[tuple[str, Path, int]] = []
        for d in sorted(self.root.glob("class/powercap/intel-rapl:*")):
            if d.name.count(":") != 1:
                continue
            try:
                name = read_text(d / "name")
            except OSError:
                name = d.name
            try:
                max_range = read_int(d / "max_energy_range_uj")
            except (OSError, ValueError):
                max_range = 0
            self.zones.append((f"{name}:{d.name.split(':')[1]}" if name == "package" else name, d / "energy_uj", max_range))
        self._last: dict[str, tuple[float, int]] = {}
        self._energy_mj = 0.0  # accumulated across wraps since this sensor started

    def available(self) -> bool:
        return bool(self.zones)

    def _read(self, t: float) -> PowerSample:
        if not self.zones:
            return PowerSample.unavailable(self.name, f"no RAPL powercap zones under {self.root}", t)
        now = self.clock()
        rails: dict[str, float] = {}
        bad: list[str] = []
        for name, path, max_range in self.zones:
            try:
                uj = read_int(path)
            except (OSError, ValueError):
                bad.append(name)
                continue
            prev = self._last.get(name)
            self._last[name] = (now, uj)
            if prev is None or now <= prev[0]:
                continue
            d_uj = wrapped_delta(uj, prev[1], max_range)
            self._energy_mj += d_uj / 1000.0
            rails[name] = d_uj / (now - prev[0]) / 1000.0  # µJ/s = µW -> mW
        if bad and len(bad) == len(self.zones):
            return PowerSample.unavailable(self.name, f"RAPL counters not readable ({', '.join(bad)}); they are often root-only", t)
        if not rails:
            return PowerSample(t_s=t, source=self.name, reason="priming the energy counter (power needs two reads)",
                               energy_mj=self._energy_mj, unreadable=bad)
        # CPU package zones, not the machine's input: a labelled sum of rails, never a "total"
        return set_power_totals(PowerSample(t_s=t, source=self.name, rails_mw=rails, energy_mj=self._energy_mj, unreadable=bad))
