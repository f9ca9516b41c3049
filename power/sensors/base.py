"""The sensor interface: ``read()`` returns a sample and never raises.

A watchdog runs next to inference; a missing file, a driver that went away or
a permission error must turn into an "unavailable" sample, not an exception in
the serving process. Subclasses implement ``_read`` and may raise the usual
I/O and parse errors; ``read`` converts them.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

from edgekit.power.sample import PowerSample

# What reading a sensor may legitimately raise: I/O (files vanish, EACCES), parse
# errors of what was read, and the errors a vendor library wraps its own in.
# Anything else is a bug in edgekit and is still caught, but reported as such.
_EXPECTED = (OSError, ValueError, KeyError, IndexError, LookupError, RuntimeError)


class Sensor(ABC):
    name: str = "sensor"
    # The shortest useful interval between reads: how often the hardware itself
    # refreshes. The watchdog's fast rate never reads a sensor more often than this.
    min_interval_s: float = 0.0

    def read(self, now: float | None = None) -> PowerSample:
        t = time.time() if now is None else now
        try:
            return self._read(t)
        except _EXPECTED as e:
            return PowerSample.unavailable(self.name, f"{type(e).__name__}: {e}", t)
        except Exception as e:  # noqa: BLE001 - a monitor must never stop inference
            return PowerSample.unavailable(self.name, f"unexpected {type(e).__name__} in {self.name} sensor: {e}", t)

    @abstractmethod
    def _read(self, t: float) -> PowerSample: ...

    def available(self) -> bool:
        """Whether the hardware behind this sensor exists here (cheap; no full read)."""
        return True

    def close(self) -> None:
        """Release handles (NVML, files); safe to call twice."""

    def describe(self) -> str:
        return self.name


class CompositeSensor(Sensor):
    """Several sensors read as one: rails, temperatures and loads merged into one sample."""

    name = "composite"

    def __init__(self, sensors: list[Sensor]):
        self.sensors = list(sensors)
        self.min_interval_s = max((s.min_interval_s for s in self.sensors), default=0.0)

    def _read(self, t: float) -> PowerSample:
        from edgekit.power.sample import merge

        if not self.sensors:
            return PowerSample.unavailable(self.name, "no sensors on this machine", t)
        return merge([s.read(t) for s in self.sensors], t)

    def close(self) -> None:
        for s in self.sensors:
            s.close()

    def describe(self) -> str:
        return " + ".join(s.describe() for s in self.sensors) or "none"
