"""Which sensors this machine (or a recorded sysfs tree) has."""

from __future__ import annotations

from pathlib import Path

from edgekit.power.sensors.base import Sensor
from edgekit.power.sensors.gpu_load import TegraGpuLoadSensor
from edgekit.power.sensors.hwmon_ina3221 import Ina3221Sensor
from edgekit.power.sensors.nvml import NvmlSensor
from edgekit.power.sensors.rapl import RaplSensor
from edgekit.power.sensors.soctherm_oc import SocthermOcSensor
from edgekit.power.sensors.system import SystemSensor
from edgekit.power.sensors.tegrastats_live import TegrastatsSensor
from edgekit.power.sensors.thermal import ThermalSensor

SENSOR_NAMES = ("ina3221", "tegrastats", "thermal", "gpu_load", "soctherm_oc", "nvml", "rapl", "system")
SYSFS_SENSORS = ("ina3221", "thermal", "gpu_load", "soctherm_oc", "rapl")


def absent_names(notes: list[str]) -> list[str]:
    """The sensor names in ``local_sensors``' notes ("name: reason")."""
    return [n.split(":", 1)[0] for n in notes]


def local_sensors(sysfs_root: str | Path | None = None, only: list[str] | None = None,
                  tegrastats_interval_ms: int = 500) -> tuple[list[Sensor], list[str]]:
    """(available sensors, notes on the absent ones).

    With a ``sysfs_root`` (a recorded or mounted tree) only the sysfs sensors
    are considered: NVML and psutil describe this machine, not that tree.
    ``tegrastats`` (a live process) is used where no INA3221 rail is readable,
    or when named in ``only``; it is never started just to be probed.
    """
    wanted = list(only) if only else list(SENSOR_NAMES)
    unknown = [n for n in wanted if n not in SENSOR_NAMES]
    if unknown:
        from edgekit.errors import SensorError

        raise SensorError(f"unknown sensor(s) {', '.join(unknown)}", hint=f"choose from {', '.join(SENSOR_NAMES)}")
    if sysfs_root is not None:
        # a live tegrastats describes this machine too, so a tree gets one only when it is asked for
        wanted = [n for n in wanted if n in SYSFS_SENSORS or (n == "tegrastats" and only and n in only)]
    makers = {
        "ina3221": lambda: Ina3221Sensor(sysfs_root),
        "tegrastats": lambda: TegrastatsSensor(tegrastats_interval_ms),
        "soctherm_oc": lambda: SocthermOcSensor(sysfs_root),
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
        if name == "tegrastats" and not (only and "tegrastats" in only) and any(f.name == "ina3221" for f in found):
            continue  # sysfs rails are readable: no process needed
        s = makers[name]()
        probe = s.read() if name == "ina3221" and s.available() else None  # rails listed but unreadable (root-only)?
        if s.available() and (probe is None or probe.available):
            found.append(s)
        else:
            notes.append(f"{name}: {(probe or s.read()).reason}")
            s.close()
    return found, notes
