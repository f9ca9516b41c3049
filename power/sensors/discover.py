"""Which sensors this machine (or a recorded sysfs tree) has."""

from __future__ import annotations

from pathlib import Path

from edgekit.power.sensors.base import Sensor
from edgekit.power.sensors.gpu_load import TegraGpuLoadSensor
from edgekit.power.sensors.hwmon_ina3221 import Ina3221Sensor
from edgekit.power.sensors.nvml import NvmlSensor
from edgekit.power.sensors.rapl import RaplSensor
from edgekit.power.sensors.system import SystemSensor
from edgekit.power.sensors.thermal import ThermalSensor

SENSOR_NAMES = ("ina3221", "thermal", "gpu_load", "nvml", "rapl", "system")


def local_sensors(sysfs_root: str | Path | None = None, only: list[str] | None = None) -> tuple[list[Sensor], list[str]]:
    """(available sensors, notes on the absent ones).

    With a ``sysfs_root`` (a recorded or mounted tree) only the sysfs sensors
    are considered: NVML and psutil describe this machine, not that tree.
    """
    wanted = list(only) if only else list(SENSOR_NAMES)
    unknown = [n for n in wanted if n not in SENSOR_NAMES]
    if unknown:
        from edgekit.errors import SensorError

        raise SensorError(f"unknown sensor(s) {', '.join(unknown)}", hint=f"choose from {', '.join(SENSOR_NAMES)}")
    if sysfs_root is not None:
        wanted = [n for n in wanted if n in ("ina3221", "thermal", "gpu_load", "rapl")]
    makers = {
        "ina3221": lambda: Ina3221Sensor(sysfs_root),
        "thermal": lambda: ThermalSensor(sysfs_root),
        "gpu_load": lambda: TegraGpuLoadSensor(sysfs_root),
        "nvml": lambda: NvmlSensor(),
        "rapl": lambda: RaplSensor(sysfs_root),
        # psutil's temperatures walk /sys/class/hwmon and the thermal zones on every read
        # (~0.5 ms); where the thermal sensor is present they would only repeat it
        "system": lambda: SystemSensor(temperatures=not any(f.name == "thermal" for f in found)),
    }
    found: list[Sensor] = []
    notes: list[str] = []
    for name in wanted:
        s = makers[name]()
        if s.available():
            found.append(s)
        else:
            notes.append(f"{name}: {s.read().reason}")
            s.close()
    return found, notes
