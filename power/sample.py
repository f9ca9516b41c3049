"""One reading of the board: power per rail, total, GPU load, temperatures, throttle signals.

Every sensor returns a ``PowerSample``. A sensor that is absent or cannot be
read returns a sample with ``available=False`` and a ``reason``; it never
raises into the inference loop. Units are in the field names.

Absent means absent: a field nobody measured stays ``None`` (or empty), never 0.
``total_mw`` is set only where the board measures its input (a ``VDD_IN``-type
rail) or the device reports its own figure (NVML). A board without an
input rail (AGX Orin) gets ``rails_sum_mw``, the sum of the rails it names in
``rails_sum_of`` -- a different quantity (it includes e.g. the 5 V system rail
and leaves out conversion losses), so it is labelled as such everywhere; RAPL's
CPU package zones are such a sum too.
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
    total_source: str | None = None  # the input rail's name, or the device's own figure ("nvml_power_usage")
    rails_sum_mw: float | None = None  # where no input rail is measured: the sum of the rails in rails_sum_of
    rails_sum_of: list[str] = field(default_factory=list)
    rails_avg_mw: dict[str, float] = field(default_factory=dict)  # tegrastats' running average (its second value)
    # JetPack 7 prints a third value per rail; NVIDIA's tegrastats documentation (R36) describes two
    # (current/average) and the third is not documented in any source we have: kept as printed, unnamed.
    rails_third_mw: dict[str, float] = field(default_factory=dict)
    placeholder_temps_c: dict[str, float] = field(default_factory=dict)  # fixed readings that are not measurements
    oc_event_counts: dict[str, int] = field(default_factory=dict)  # soctherm over-current counters (cumulative)
    oc_throttle_enabled: dict[str, bool] = field(default_factory=dict)
    trips: dict[str, dict[str, Any]] = field(default_factory=dict)  # zone -> the trip point it is at or above
    gpu_max_freq_mhz: float | None = None  # the clock ceiling the power mode allows (devfreq max_freq)
    emc_freq_mhz: float | None = None
    emc_load_pct: float | None = None
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
        d["rails_sum_mw"] = None if self.rails_sum_mw is None else round(self.rails_sum_mw, 3)  # a reading: always
        d["rails_sum_of"] = list(self.rails_sum_of) if self.rails_sum_mw is not None else []
        for k in ("rails_avg_mw", "rails_third_mw", "placeholder_temps_c", "oc_event_counts", "oc_throttle_enabled", "trips"):
            v = getattr(self, k)
            if v:
                d[k] = dict(v)
        # readings: always there, null where this source or this sample has none (a CPU's load is a difference of
        # two reads, so the first sample has none), so every line of a stream has the readings' keys (the maps below
        # and reason / unreadable are there only when they say something)
        for k in ("gpu_freq_mhz", "gpu_max_freq_mhz", "emc_freq_mhz", "emc_load_pct", "cpu_load_pct", "mem_used_mb",
                  "mem_total_mb", "energy_mj"):
            d[k] = getattr(self, k)
        if self.reason is not None:
            d["reason"] = self.reason
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
            rails_sum_mw=None if d.get("rails_sum_mw") is None else float(d["rails_sum_mw"]),
            rails_sum_of=list(d.get("rails_sum_of") or []),
            rails_avg_mw={str(k): float(v) for k, v in (d.get("rails_avg_mw") or {}).items()},
            rails_third_mw={str(k): float(v) for k, v in (d.get("rails_third_mw") or {}).items()},
            placeholder_temps_c={str(k): float(v) for k, v in (d.get("placeholder_temps_c") or {}).items()},
            oc_event_counts={str(k): int(v) for k, v in (d.get("oc_event_counts") or {}).items()},
            oc_throttle_enabled={str(k): bool(v) for k, v in (d.get("oc_throttle_enabled") or {}).items()},
            trips={str(k): dict(v) for k, v in (d.get("trips") or {}).items()},
            gpu_load_pct=d.get("gpu_load_pct"),
            gpu_freq_mhz=d.get("gpu_freq_mhz"),
            gpu_max_freq_mhz=d.get("gpu_max_freq_mhz"),
            emc_freq_mhz=d.get("emc_freq_mhz"),
            emc_load_pct=d.get("emc_load_pct"),
            cpu_load_pct=d.get("cpu_load_pct"),
            mem_used_mb=d.get("mem_used_mb"),
            mem_total_mb=d.get("mem_total_mb"),
            temps_c={str(k): float(v) for k, v in (d.get("temps_c") or {}).items()},
            energy_mj=d.get("energy_mj"),
            unreadable=list(d.get("unreadable") or []),
        )


    def budget_power(self) -> tuple[float | None, str | None]:
        """(mW, what it is) for the power band: the measured total, else the labelled sum of rails."""
        if self.total_mw is not None:
            return self.total_mw, self.total_source
        if self.rails_sum_mw is not None:
            return self.rails_sum_mw, rails_sum_label(self.rails_sum_of)
        return None, None


def is_input_rail(name: str) -> bool:
    return name.upper() in INPUT_RAILS


def rails_sum_label(names: list[str]) -> str:
    return "sum of " + " + ".join(names)


def set_power_totals(s: PowerSample, unreadable: list[str] | None = None) -> PowerSample:
    """Fill ``total_mw`` (the input rail, where measured) or ``rails_sum_mw`` (the named rails) from ``rails_mw``.

    Where the board has an input rail that could not be read this time, neither is set: a sum of
    the sub-rails would be a different quantity passed off under the same name.
    """
    s.total_mw = s.total_source = s.rails_sum_mw = None
    s.rails_sum_of = []
    for name in INPUT_RAILS:
        for rail, mw in s.rails_mw.items():
            if rail.upper() == name:
                s.total_mw, s.total_source = mw, rail
                return s
    if s.rails_mw and not any(is_input_rail(r) for r in unreadable or []):
        s.rails_sum_of = list(s.rails_mw)
        s.rails_sum_mw = sum(s.rails_mw.values())
    return s


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
        if out.rails_sum_mw is None and s.rails_sum_mw is not None:
            out.rails_sum_mw, out.rails_sum_of = s.rails_sum_mw, s.rails_sum_of
        for name in ("rails_avg_mw", "rails_third_mw", "placeholder_temps_c", "oc_event_counts", "oc_throttle_enabled", "trips"):
            mine, theirs = getattr(out, name), getattr(s, name)
            if theirs:
                setattr(out, name, {**theirs, **mine} if mine else dict(theirs))
        if out.gpu_max_freq_mhz is None:
            out.gpu_max_freq_mhz = s.gpu_max_freq_mhz
        if out.emc_freq_mhz is None:
            out.emc_freq_mhz, out.emc_load_pct = s.emc_freq_mhz, s.emc_load_pct
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
