"""Orin over-current and under-voltage event counters (the ``soctherm_oc`` hwmon device).

Tegra234 boards (JetPack 5 and 6) expose the SOC_THERM over-current (OC) alarms
as a hwmon device named ``soctherm_oc`` (``/sys/class/hwmon/hwmon<N>``, a link to
``/sys/devices/platform/soctherm-oc-event/hwmon/hwmon<N>``)::

    name             soctherm_oc
    oc1_event_cnt    0     under-voltage events since boot
    oc2_event_cnt    15    average over-current events
    oc3_event_cnt    37    instantaneous over-current events
    ocN_throt_en     1     whether the hardware throttles CPU/GPU on that alarm

The meanings of OC1-OC3 are those of NVIDIA's "Platform Power and Performance"
guide for the Orin series (R36). The counters only grow until reboot; each
increase is a brown-out style event in which the hardware cut CPU/GPU clocks for
a moment -- throttling no clock or temperature reading shows. The driver answers
each read with a message to the BPMP firmware, so the sensor reads once a second;
the policy turns the increase per read into an ``over_current`` event.
"""

from __future__ import annotations

import re
from pathlib import Path

from edgekit.power.sample import PowerSample
from edgekit.power.sensors.base import Sensor
from edgekit.power.sensors.sysfs import read_int, read_text, resolve_root

OC_MEANING = {"oc1": "under-voltage", "oc2": "average over-current", "oc3": "instantaneous over-current"}
_COUNTER = re.compile(r"^(oc\d+)_event_cnt$")


def find_soctherm_oc(root: str | Path | None = None) -> Path | None:
    sys_root = resolve_root(root)
    for d in [*sorted(sys_root.glob("class/hwmon/hwmon*")), *sorted(sys_root.glob("devices/platform/soctherm-oc-event/hwmon/hwmon*"))]:
        try:
            if read_text(d / "name") == "soctherm_oc":
                return d
        except OSError:
            continue
    return None


class SocthermOcSensor(Sensor):
    """Cumulative OC event counters and whether each alarm throttles."""

    name = "soctherm_oc"
    min_interval_s = 1.0

    def __init__(self, root: str | Path | None = None):
        self.root = resolve_root(root)
        self.dir = find_soctherm_oc(self.root)
        self.channels = sorted(
            (m.group(1) for f in (self.dir.iterdir() if self.dir else ()) if (m := _COUNTER.match(f.name))),
            key=lambda c: int(c[2:]),
        )

    def available(self) -> bool:
        return bool(self.channels)

    def _read(self, t: float) -> PowerSample:
        if not self.channels:
            return PowerSample.unavailable(self.name, f"no soctherm_oc hwmon device under {self.root}", t)
        counts: dict[str, int] = {}
        enabled: dict[str, bool] = {}
        bad: list[str] = []
        for ch in self.channels:
            try:
                counts[ch] = read_int(self.dir / f"{ch}_event_cnt")
            except (OSError, ValueError):
                bad.append(ch)
                continue
            try:
                enabled[ch] = read_int(self.dir / f"{ch}_throt_en") != 0
            except (OSError, ValueError):
                pass  # the counter alone still tells that the alarm fired
        if not counts:
            return PowerSample.unavailable(self.name, f"no OC counter could be read ({', '.join(bad)})", t)
        return PowerSample(t_s=t, source=self.name, oc_event_counts=counts, oc_throttle_enabled=enabled, unreadable=bad,
                           reason=f"unreadable counters: {', '.join(bad)}" if bad else None)

    def describe(self) -> str:
        return f"soctherm_oc ({', '.join(self.channels)})" if self.channels else "soctherm_oc (absent)"
