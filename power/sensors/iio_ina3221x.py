"""JetPack 4 power rails: the ``ina3221x`` IIO driver (Jetson Nano, TX2, Xavier).

Layout (L4T 32.x; NVIDIA's Jetson Nano/TX2/Xavier power-monitoring docs and
jetson_stats read the same files)::

    /sys/bus/i2c/drivers/ina3221x/<bus>-<addr>/iio:device<N>/
        rail_name_0          POM_5V_IN     rail name of channel 0 (1, 2 likewise)
        in_voltage0_input    5072          bus voltage, mV
        in_current0_input    400           current, mA
        in_power0_input      2027          power, mW (the driver's own product)

Voltage and current are read (not ``in_power``) so both layouts give power the
same way and share one reading path. The directory is ``iio:device<N>`` on most
releases and ``iio_device`` on some; both are globbed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgekit.power.sensors.sysfs import read_text, resolve_root


@dataclass(frozen=True)
class IioChannel:
    rail: str
    chip: str
    voltage_path: Path
    current_path: Path


def find_iio_channels(root: str | Path | None = None) -> list[IioChannel]:
    sys_root = resolve_root(root)
    out: list[IioChannel] = []
    devices = sorted({*sys_root.glob("bus/i2c/drivers/ina3221x/*/iio:device*"), *sys_root.glob("bus/i2c/drivers/ina3221x/*/iio_device")})
    for dev in devices:
        chip = dev.parent.name
        for name_file in sorted(dev.glob("rail_name_*")):
            idx = name_file.name.rsplit("_", 1)[-1]
            try:
                rail = read_text(name_file)
            except OSError:
                continue
            voltage, current = dev / f"in_voltage{idx}_input", dev / f"in_current{idx}_input"
            if not rail or rail.upper() == "NC" or not current.exists():
                continue
            out.append(IioChannel(rail, chip, voltage, current))
    return out
