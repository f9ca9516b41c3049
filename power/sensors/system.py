"""CPU load, memory and (where the OS reports them) temperatures through psutil.

This is the sensor every machine has, so the monitor always shows something.
``psutil.cpu_percent(None)`` measures since its previous call, which is why the
first read of a fresh sensor reports 0 % and the sensor is not read faster
than once a second (a read costs ~0.1-0.5 ms of CPU, and these numbers move slowly).
"""

from __future__ import annotations

from edgekit.power.sample import PowerSample
from edgekit.power.sensors.base import Sensor
from edgekit.power.sensors.thermal import valid_temp_c, zone_name


class SystemSensor(Sensor):
    name = "system"
    min_interval_s = 1.0

    def __init__(self, temperatures: bool = True):
        self.temperatures = temperatures
        try:
            import psutil

            self._psutil = psutil
            psutil.cpu_percent(None)  # prime the counter
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
        return PowerSample(
            t_s=t, source=self.name, cpu_load_pct=float(ps.cpu_percent(None)),
            mem_used_mb=(vm.total - vm.available) / 2**20, mem_total_mb=vm.total / 2**20, temps_c=temps,
        )
