"""Jetson power rails from the INA3221 monitors through sysfs hwmon.

Layout (Linux ``ina3221`` driver, JetPack 5 and later)::

    /sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon<N>/
        in1_label   VDD_IN        rail name, "NC" when the channel is unconnected
        in1_input   5080          bus voltage, mV
        curr1_input 844           current, mA
        in7_input                 the summation channel (no current file): skipped

The hwmon number differs between boards and boots, so it is globbed. Chips are
also found through ``bus/i2c/devices/*/name`` and ``class/hwmon/*/name``. Power
is mV x mA / 1000 = mW. The total is VDD_IN where the board has it (Orin NX and
Nano); AGX Orin has no input rail, so it gets a labelled sum of its rails instead
(``rails_sum_mw``), never a "total". JetPack 4 boards (Nano, TX2, Xavier) expose
the same chips through the older ``ina3221x`` IIO driver (``iio_ina3221x.py``);
both layouts are read by this one sensor.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from edgekit.power.sample import PowerSample, set_power_totals
from edgekit.power.sensors.base import Sensor
from edgekit.power.sensors.sysfs import ValueFile, read_int, read_text, resolve_root

_LABEL = re.compile(r"^in(\d+)_label$")
# Each read of an INA3221 value is an I2C transaction in the kernel (two per rail),
# and the chip only refreshes once per conversion period (its hwmon
# `update_interval`, in ms): reading faster returns the same number and costs CPU.
# 50 ms (20 Hz) is the floor even where the chip converts faster: the chip averages
# in hardware, so nothing is lost for energy, and at 20 Hz a power sample stays a
# small part of the watchdog's budget (scripts/bench_watchdog.py measures the whole).
_MIN_INTERVAL_S = 0.050
_MAX_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Channel:
    rail: str
    chip: str  # i2c address, e.g. "1-0040"
    voltage_path: Path  # mV
    current_path: Path  # mA


def find_chips(root: str | Path | None = None) -> list[Path]:
    """hwmon directories of every INA3221 under the sysfs root, in a stable order."""
    sys_root = resolve_root(root)
    found: list[Path] = []
    found += sys_root.glob("bus/i2c/drivers/ina3221/*/hwmon/hwmon*")
    for name_file in sys_root.glob("bus/i2c/devices/*/name"):
        if _safe_text(name_file) == "ina3221":
            found += name_file.parent.glob("hwmon/hwmon*")
    for name_file in sys_root.glob("class/hwmon/hwmon*/name"):
        if _safe_text(name_file) == "ina3221":
            found.append(name_file.parent)
    unique: dict[str, Path] = {}
    for p in found:
        if p.is_dir():
            unique.setdefault(os.path.realpath(p), p)
    return sorted(unique.values(), key=lambda p: (_chip_name(p), p.name))


def find_channels(root: str | Path | None = None) -> list[Channel]:
    """Connected rails of every chip: labelled, not "NC", with a current file, not disabled.

    The hwmon layout (JetPack 5 and later) first, then the JetPack 4 ``ina3221x`` IIO layout.
    """
    from edgekit.power.sensors.iio_ina3221x import find_iio_channels

    channels: list[Channel] = []
    seen: set[str] = set()
    for hw in find_chips(root):
        chip = _chip_name(hw)
        for label_file in sorted(hw.glob("in*_label"), key=lambda p: _channel_index(p.name)):
            n = _channel_index(label_file.name)
            label = _safe_text(label_file)
            if not label or label.upper() == "NC":
                continue  # unconnected channel
            current = hw / f"curr{n}_input"
            if not current.exists():
                continue  # the summation channel (in7) and shunt-only channels have no current
            enable = hw / f"in{n}_enable"
            if enable.exists() and _safe_text(enable) == "0":
                continue
            rail = label if label not in seen else f"{label}@{chip}"
            seen.add(rail)
            channels.append(Channel(rail, chip, hw / f"in{n}_input", current))
    for ch in find_iio_channels(root):
        rail = ch.rail if ch.rail not in seen else f"{ch.rail}@{ch.chip}"
        seen.add(rail)
        channels.append(Channel(rail, ch.chip, ch.voltage_path, ch.current_path))
    return channels


class Ina3221Sensor(Sensor):
    """Power per rail (mW) from every INA3221 on the board."""

    name = "ina3221"

    def __init__(self, root: str | Path | None = None, reopen_s: float = 1.0):
        self.root = resolve_root(root)
        self.reopen_s = reopen_s
        self._channels: list[Channel] | None = None
        self._files: dict[Path, ValueFile] = {}
        self.min_interval_s = _MIN_INTERVAL_S

    @property
    def channels(self) -> list[Channel]:
        if self._channels is None:
            self._channels = find_channels(self.root)
            self.min_interval_s = _refresh_interval_s({c.voltage_path.parent for c in self._channels})
        return self._channels

    def _value(self, path: Path, now: float) -> int:
        f = self._files.get(path)
        if f is None:
            f = self._files[path] = ValueFile(path, self.reopen_s)
        return f.read_int(now)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def available(self) -> bool:
        return bool(self.channels)

    def _read(self, t: float) -> PowerSample:
        if not self.channels:
            return PowerSample.unavailable(self.name, f"no INA3221 power monitor under {self.root}", t)
        rails: dict[str, float] = {}
        bad: list[str] = []
        now = time.monotonic()
        for ch in self.channels:
            try:
                mv = self._value(ch.voltage_path, now)
                ma = self._value(ch.current_path, now)
            except (OSError, ValueError):
                bad.append(ch.rail)
                continue
            rails[ch.rail] = mv * ma / 1000.0
        if not rails:
            self._channels = None  # the driver may have been rebound: look again next time
            self.close()
            return PowerSample.unavailable(self.name, f"no rail could be read ({', '.join(bad)})", t)
        reason = f"unreadable rails: {', '.join(bad)}" if bad else None
        return set_power_totals(PowerSample(t_s=t, source=self.name, rails_mw=rails, unreadable=bad, reason=reason), bad)

    def describe(self) -> str:
        chips = sorted({c.chip for c in self.channels})
        return f"ina3221 ({', '.join(chips) or 'none'}: {', '.join(c.rail for c in self.channels)})"


def _refresh_interval_s(hwmon_dirs: set[Path]) -> float:
    """The slowest chip's conversion period (hwmon `update_interval`, ms), clamped to [50 ms, 1 s]."""
    worst = _MIN_INTERVAL_S
    for d in hwmon_dirs:
        try:
            worst = max(worst, read_int(d / "update_interval") / 1000.0)
        except (OSError, ValueError):
            continue
    return min(worst, _MAX_INTERVAL_S)


def _chip_name(hwmon_dir: Path) -> str:
    # .../1-0040/hwmon/hwmon3 -> "1-0040"; class/hwmon/hwmon3 -> the device link's target name
    if hwmon_dir.parent.name == "hwmon":
        return hwmon_dir.parent.parent.name
    dev = hwmon_dir / "device"
    return Path(os.path.realpath(dev)).name if dev.exists() else hwmon_dir.name


def _channel_index(filename: str) -> int:
    m = _LABEL.match(filename)
    return int(m.group(1)) if m else 0


def _safe_text(path: Path) -> str:
    try:
        return read_text(path)
    except OSError:
        return ""
