"""CPU load, memory and (where the OS reports them) temperatures through psutil.

This is the sensor every machine has, so the monitor always shows something.
``psutil.cpu_percent(None)`` measures since its previous call: the sensor primes it when made, and a read that
comes too soon after the previous one (the watchdog's first tick, right after start) has no interval to measure
over and reports no CPU load (None) rather than psutil's meaningless 0 %. The sensor is not read faster than once
a second (a read costs ~0.1-0.5 ms of CPU, and these numbers move slowly).
"""

from __future__ import annotations

import time

from edgekit.power.sample import PowerSample
from edgekit.power.sensors.base import Sensor
from edgekit.power.sensors.thermal import valid_temp_c, zone_name


# Below this since the previous cpu_percent call, psutil's answer is a count of a few scheduler ticks (often 0.0).
MIN_CPU_INTERVAL_S = 0.1


class SystemSensor(Sensor):
    name = "system"
    min_interval_s = 1.0

    def __init__(self, temperatures: bool = True):
        self.temperatures = temperatures
        try:
            import psutil

            self._psutil = psutil
            psutil.cpu_percent(None)  # prime the counter
            self._cpu_at = time.monotonic()
        except ImportError:
            self._psutil = None

    def available(self) -> bool:
        return self._psutil is not None

    def _read(self, t: float) -> PowerSample:
        ps = self._psutil
        if ps is None:
            return PowerSample.unavailable(self.name, "psutil is not installed", t)
        vm = ps.virtual_memory()
        temps: dict[str, float] = {}
        if self.temperatures and hasattr(ps, "sensors_temperatures"):
            try:
                for chip, entries in ps.sensors_temperatures().items():
                    for i, e in enumerate(entries):
                        key = zone_name(e.label or chip) if (e.label or len(entries) == 1) else f"{zone_name(chip)}{i}"
                        if valid_temp_c(e.current):
                            temps.setdefault(key, float(e.current))
            except OSError:
                pass
        load, now = float(ps.cpu_percent(None)), time.monotonic()
        measured, self._cpu_at = now - self._cpu_at >= MIN_CPU_INTERVAL_S, now
        return PowerSample(
            t_s=t, source=self.name, cpu_load_pct=load if measured else None,
            mem_used_mb=(vm.total - vm.available) / 2**20, mem_total_mb=vm.total / 2**20, temps_c=temps,
        )
