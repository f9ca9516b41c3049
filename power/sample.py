"""One reading of the board: power per rail, total, GPU load, temperatures.

Every sensor returns a ``PowerSample``. A sensor that is absent or cannot be
read returns a sample with ``available=False`` and a ``reason``; it never
raises into the inference loop. Units are in the field names.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

# Rails that carry the module's whole input power. Where one is present it is the
# total; summing sub-rails as well would count the same watts twice.
INPUT_RAILS = ("VDD_IN", "POM_5V_IN")


@dataclass
class PowerSample:
    t_s: float  # wall-clock seconds (epoch) of the reading; replayed logs use the log's own clock
    source: str  # which sensor produced it: "ina3221", "tegrastats", "nvml", "rapl", "system", ...
    available: bool = True
    reason: str | None = None  # why the sample is unavailable or partial
    rails_mw: dict[str, float] = field(default_factory=dict)
    total_mw: float | None = None
    total_source: str | None = None  # the input rail's name, "sum_of_rails" or the device's own figure
    gpu_load_pct: float | None = None
    gpu_freq_mhz: float | None = None
    cpu_load_pct: float | None = None
    mem_used_mb: float | None = None
    mem_total_mb: float | None = None
    temps_c: dict[str, float] = field(default_factory=dict)
    energy_mj: float | None = None  # a cumulative counter (NVML, RAPL) where the device keeps one
    unreadable: list[str] = field(default_factory=list)  # rails/zones that exist but could not be read

    @classmethod
    def unavailable(cls, source: str, reason: str, t_s: float) -> "PowerSample":
        return cls(t_s=t_s, source=source, available=False, reason=reason)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "t_s": round(self.t_s, 6),
            "time": iso_time(self.t_s),
            "source": self.source,
            "available": self.available,
            "rails_mw": {k: round(v, 3) for k, v in self.rails_mw.items()},
            "total_mw": None if self.total_mw is None else round(self.total_mw, 3),
            "total_source": self.total_source,
            "gpu_load_pct": self.gpu_load_pct,
            "temps_c": {k: round(v, 3) for k, v in self.temps_c.items()},
        }
        for k in ("gpu_freq_mhz", "cpu_load_pct", "mem_used_mb", "mem_total_mb", "energy_mj", "reason"):
            v = getattr(self, k)
            if v is not None:
                d[k] = v
        if self.unreadable:
            d["unreadable"] = list(self.unreadable)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PowerSample":
        return cls(
            t_s=float(d["t_s"]),
            source=str(d.get("source", "log")),
            available=bool(d.get("available", True)),
            reason=d.get("reason"),
            rails_mw={str(k): float(v) for k, v in (d.get("rails_mw") or {}).items()},
            total_mw=None if d.get("total_mw") is None else float(d["total_mw"]),
            total_source=d.get("total_source"),
            gpu_load_pct=d.get("gpu_load_pct"),
            gpu_freq_mhz=d.get("gpu_freq_mhz"),
            cpu_load_pct=d.get("cpu_load_pct"),
            mem_used_mb=d.get("mem_used_mb"),
            mem_total_mb=d.get("mem_total_mb"),
            temps_c={str(k): float(v) for k, v in (d.get("temps_c") or {}).items()},
            energy_mj=d.get("energy_mj"),
            unreadable=list(d.get("unreadable") or []),
        )


def total_from_rails(rails_mw: dict[str, float]) -> tuple[float | None, str | None]:
    """The board's total: the input rail where there is one, else the sum of the rails."""
    for name in INPUT_RAILS:
        for rail, mw in rails_mw.items():
            if rail.upper() == name:
                return mw, rail
    if not rails_mw:
        return None, None
    return sum(rails_mw.values()), "sum_of_rails"


def merge(samples: list[PowerSample], t_s: float) -> PowerSample:
    """Fold the samples of several sensors into one (first sensor wins on a clash).

    The merged sample is available when any part is; the reasons of the
    unavailable parts are kept so the operator sees which sensor is missing.
    Written out field by field: the watchdog calls this at its sensor rate.
    """
    out = PowerSample(t_s=t_s, source="")
    sources, reasons = [], []
    for s in samples:
        if not s.available:
            reasons.append(f"{s.source}: {s.reason}")
            continue
        sources.append(s.source)
        if s.rails_mw:
            out.rails_mw = {**s.rails_mw, **out.rails_mw} if out.rails_mw else dict(s.rails_mw)
        if s.temps_c:
            out.temps_c = {**s.temps_c, **out.temps_c} if out.temps_c else dict(s.temps_c)
        if out.total_mw is None and s.total_mw is not None:
            out.total_mw, out.total_source = s.total_mw, s.total_source
        if out.gpu_load_pct is None:
            out.gpu_load_pct = s.gpu_load_pct
        if out.gpu_freq_mhz is None:
            out.gpu_freq_mhz = s.gpu_freq_mhz
        if out.cpu_load_pct is None:
            out.cpu_load_pct = s.cpu_load_pct
        if out.mem_used_mb is None:
            out.mem_used_mb, out.mem_total_mb = s.mem_used_mb, s.mem_total_mb
        if out.energy_mj is None:
            out.energy_mj = s.energy_mj
        if s.unreadable:
            out.unreadable.extend(s.unreadable)
    out.source = "+".join(sources) or "none"
    out.available = bool(sources)
    out.reason = "; ".join(reasons) or None
    return out


def iso_time(t_s: float) -> str | None:
    """ISO-8601 UTC for epoch seconds; None for a relative clock (replayed logs without timestamps)."""
    if t_s < 1e8:  # before 1973: not an epoch time, a relative one
        return None
    return _dt.datetime.fromtimestamp(t_s, _dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
