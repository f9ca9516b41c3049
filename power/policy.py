"""Watchdog policies: budgets from a target profile, overrides per deployment, rules that raise events.

``PolicyConfig`` is this package's own model with defaults that match the
product card (5 ms jitter budget, ±3 W power band); ``from_profile`` reads the
budgets out of a plain dict (a target profile as loaded from YAML) and applies
a deployment's overrides on top, so the runtime can feed it without this
package depending on the target code.

``PolicyEngine`` holds the rules. It is pure: it takes observations and times
and returns events, so it runs the same on a live board, on a replayed
tegrastats log and in tests.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from edgekit.errors import ConfigError
from edgekit.power.band_quantity import BandQuantity
from edgekit.power.events import EVENT_KINDS, Event
from edgekit.power.latency import METRICS, WindowStats
from edgekit.power.sample import PowerSample
from edgekit.power.sensors.soctherm_oc import OC_MEANING
from edgekit.power.sensors.thermal import zone_name

# Readings before a sensor event says that one a rule needs is missing: power readings in a row that lack a rail the
# band holds, or readings with temperatures none of which had a watched zone. One torn line or failed read is no
# news; a rail or zone missing from ten is (10 s at the default 1 s).
READINGS_BEFORE_SENSOR_WARNING = 10


class TemperatureLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # inf or nan turned a limit off without a word
    # Defaults sit well below the Orin SoC's software throttling point, so the
    # warning comes while something can still be done; a target may tighten them.
    warn_c: float = Field(85.0, description="a warning event above this, °C")
    critical_c: float = Field(95.0, description="a critical event above this, °C")
    zones: list[str] | None = Field(None, description="zone names to watch (cpu, gpu, tj, ...); None watches all")

    @field_validator("zones")
    @classmethod
    def _as_read(cls, zones: list[str] | None) -> list[str] | None:
        """Zone names as the sensors name them ('CPU', 'cpu-thermal' -> 'cpu'): 'CPU' matched no reading, and the rule
        watched nothing."""
        return None if zones is None else [zone_name(z) for z in zones]

    @model_validator(mode="after")
    def _ordered(self) -> "TemperatureLimits":
        if self.critical_c < self.warn_c:
            raise ValueError(f"critical_c ({self.critical_c}) must be >= warn_c ({self.warn_c})")
        return self


class PolicyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # inf or nan turned a budget off without a word

    jitter_budget_ms: float = Field(5.0, gt=0, description="allowed p99 - p50 of token latency, and the allowed excess of one token over p50")
    jitter_metrics: list[str] = Field(default_factory=lambda: ["token"], description="latency metrics held to the jitter budget")
    window_s: float = Field(10.0, gt=0, description="rolling window for percentiles")
    min_samples: int = Field(20, ge=2, description="observations needed in the window before latency rules apply")
    power_band_w: float = Field(3.0, gt=0, description="allowed distance of total power from its centre, W")
    power_target_w: float | None = Field(None, gt=0, description="centre of the band; None learns it from the first power_baseline_s")
    power_baseline_s: float = Field(5.0, ge=0, description="seconds of samples whose median becomes the centre when no target is given")
    power_sustain_s: float = Field(1.0, ge=0, description="a power breach must last this long before it is an event")
    temperature: TemperatureLimits = Field(default_factory=TemperatureLimits)
    clock_busy_pct: float = Field(50.0, ge=0, le=100, description="GPU load at or above which a clock below the power mode's ceiling is throttling (below it, DVFS lowering an idle clock is normal)")
    clock_drop_ratio: float = Field(0.9, gt=0, le=1, description="a busy GPU clocked below this fraction of its ceiling is throttled")
    cooldown_s: float = Field(5.0, ge=0, description="the same rule on the same metric is not raised again within this time")
    actions: dict[str, list[str]] = Field(
        default_factory=lambda: {"jitter": ["rollback_plugin"], "power_band": ["shed_load"]},
        description="event kind -> action names run when it is raised (power_mode: nvpmodel)",
    )

    # A name that matches nothing was taken and its rule never ran: jitter_metrics [tokens] turned the jitter budget
    # off, actions {jiter: ...} never ran; both without a word
    @field_validator("jitter_metrics")
    @classmethod
    def _known_metrics(cls, names: list[str]) -> list[str]:
        return _known("latency metric", names, METRICS)

    @field_validator("actions")
    @classmethod
    def _known_event_kinds(cls, actions: dict[str, list[str]]) -> dict[str, list[str]]:
        _known("event kind", list(actions), EVENT_KINDS)
        return actions

    @classmethod
    def from_profile(cls, profile: Mapping[str, Any] | None = None, overrides: Mapping[str, Any] | None = None) -> "PolicyConfig":
        """Budgets from a target profile (a plain dict), then per-deployment overrides.

        The profile is searched for ``jitter_budget_ms``, ``power_band_w``,
        ``power_target_w`` and ``temperature`` (or the flat names in
        ``_TEMP_ALIASES``, e.g. ``temperature_warn_c`` / ``temperature_limit_c``) at its top level and under ``watchdog`` or
        ``budgets``; its other keys belong to other parts of edgekit and are
        ignored. Overrides are checked strictly: an unknown key is an error.
        """
        base: dict[str, Any] = {}
        if profile:
            for section in (profile, profile.get("budgets") or {}, profile.get("watchdog") or {}):
                if not isinstance(section, Mapping):
                    continue
                for key in cls.model_fields:
                    if key in section:
                        base[key] = section[key]
                temp = dict(base.get("temperature") or {})
                for alias, key in _TEMP_ALIASES.items():
                    if alias in section:
                        temp[key] = section[alias]
                if temp:
                    base["temperature"] = temp
        merged = _deep_merge(base, dict(overrides or {}))
        try:
            return cls.model_validate(merged)
        except ValidationError as e:
            raise ConfigError(_explain(e, merged), hint="fix the watchdog budgets in the target profile or the overrides") from e


# Flat names a target profile may use for the temperature limits.
_TEMP_ALIASES = {
    "temp_warn_c": "warn_c", "temperature_warn_c": "warn_c",
    "temp_critical_c": "critical_c", "temperature_critical_c": "critical_c", "temperature_limit_c": "critical_c",
}


def _known(what: str, names: list[str], known: tuple[str, ...]) -> list[str]:
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown {what}{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                         f"choose from {', '.join(known)}")
    return names


def _deep_merge(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def _explain(e: ValidationError, data: Mapping[str, Any]) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        parts.append(f"{loc}: {err['msg']} (got {err.get('input')!r})")
    return "invalid watchdog policy: " + "; ".join(parts) + f"; allowed keys: {', '.join(PolicyConfig.model_fields)}"


class PolicyEngine:
    """The rules. Each check returns the events it raises (often none)."""

    def __init__(self, config: PolicyConfig | None = None):
        self.config = config or PolicyConfig()
        self._last_raised: dict[tuple[str, str], float] = {}
        self._power_first_t: float | None = None
        self._power_baseline: list[float] = []
        self.power_centre_w: float | None = self.config.power_target_w
        self._breach_since: float | None = None
        self._breach_values: deque[tuple[float, float]] = deque(maxlen=64)
        self._band_quantity: BandQuantity | None = None  # what the band holds (edgekit.power.band_quantity)
        self._lesser_readings = 0  # readings in a row of less than it holds (not compared)
        self._zone_readings, self._zones_read = 0, set()  # readings with temperatures seen, the zones they had
        self._sensor_ok: dict[str, bool] = {}
        self._oc_last: dict[str, tuple[float, int]] = {}  # channel -> (t, count) at the previous reading

    # -- bookkeeping ----------------------------------------------------------
    def _cooled(self, kind: str, key: str, t: float) -> bool:
        last = self._last_raised.get((kind, key))
        if last is not None and t - last < self.config.cooldown_s:
            return False
        self._last_raised[(kind, key)] = t
        return True

    # -- latency --------------------------------------------------------------
    def check_spikes(self, metric: str, new: list[tuple[float, float]], before: WindowStats | None, t_wall: float) -> list[Event]:
        """A single observation more than the budget above the window's p50 (the window before it)."""
        cfg = self.config
        if metric not in cfg.jitter_metrics or before is None or before.n < cfg.min_samples or not new:
            return []
        limit = before.p50_ms + cfg.jitter_budget_ms
        worst_t, worst = max(new, key=lambda x: x[1])
        if worst <= limit or not self._cooled("jitter", f"{metric}:spike", t_wall):
            return []
        return [Event(
            t_s=t_wall, kind="jitter", severity="warning",
            message=f"{metric} latency spike: {worst:.2f} ms is {worst - before.p50_ms:.2f} ms above the p50 "
                    f"({before.p50_ms:.2f} ms); budget {cfg.jitter_budget_ms:g} ms",
            evidence={
                "rule": "spike", "metric": metric, "value_ms": round(worst, 4), "p50_ms": round(before.p50_ms, 4),
                "excess_ms": round(worst - before.p50_ms, 4), "budget_ms": cfg.jitter_budget_ms,
                "window_s": before.window_s, "window_n": before.n, "observed_mono_s": worst_t,
                "new_values_ms": [round(v, 4) for _, v in new[-16:]],
            },
        )]

    def check_window(self, stats: WindowStats | None, t_wall: float) -> list[Event]:
        """The window's jitter (p99 - p50) above the budget."""
        cfg = self.config
        if stats is None or stats.metric not in cfg.jitter_metrics or stats.n < cfg.min_samples:
            return []
        if stats.jitter_ms <= cfg.jitter_budget_ms or not self._cooled("jitter", f"{stats.metric}:window", t_wall):
            return []
        return [Event(
            t_s=t_wall, kind="jitter", severity="warning",
            message=f"{stats.metric} jitter p99-p50 = {stats.jitter_ms:.2f} ms over {stats.n} samples "
                    f"exceeds the {cfg.jitter_budget_ms:g} ms budget",
            evidence={"rule": "p99-p50", "budget_ms": cfg.jitter_budget_ms, **stats.to_dict()},
        )]

    # -- power ----------------------------------------------------------------
    def check_power(self, sample: PowerSample) -> list[Event]:
        """Board power outside centre ± band for at least power_sustain_s.

        The measured total where the board has one, else the labelled sum of its rails
        (the same quantity every sample, so a band around it still means something).
        """
        cfg = self.config
        mw, what = sample.budget_power() if sample.available else (None, None)
        if mw is None:
            return []
        quantity = BandQuantity.of(sample)
        if not self._holds(quantity):
            return self._band_blind(sample, quantity)
        self._lesser_readings = 0
        t, w = sample.t_s, mw / 1000.0
        if self.power_centre_w is None:  # learn the centre from the first seconds
            if self._power_first_t is None:
                self._power_first_t = t
            if t - self._power_first_t < cfg.power_baseline_s or not self._power_baseline:
                self._power_baseline.append(w)
                return []
            self.power_centre_w = statistics.median(self._power_baseline)
        centre, band = self.power_centre_w, cfg.power_band_w
        if abs(w - centre) <= band:
            self._breach_since = None
            self._breach_values.clear()
            return []
        if self._breach_since is None:
            self._breach_since = t
        self._breach_values.append((t, w))
        lasted = t - self._breach_since
        if lasted < cfg.power_sustain_s or not self._cooled("power_band", "total", t):
            return []
        values = [round(v, 3) for _, v in self._breach_values]
        side = "above" if w > centre else "below"
        label = "total power" if sample.total_mw is not None else what
        return [Event(
            t_s=t, kind="power_band", severity="warning",
            message=f"{label} {w:.2f} W is {side} the band {centre:.2f} ± {band:g} W for {lasted:.1f} s",
            evidence={
                "rule": "band", "total_w": round(w, 3), "centre_w": round(centre, 3), "band_w": band,
                "centre_source": "target" if cfg.power_target_w is not None else "baseline_median",
                "breach_s": round(lasted, 3), "window_values_w": values[-32:],
                "rails_mw": {k: round(v, 1) for k, v in sample.rails_mw.items()}, "total_source": what,
            },
        )]

    def _holds(self, quantity: BandQuantity | None) -> bool:
        """Whether the band compares this reading: the quantity it holds, or a more complete one that takes its place
        (then a centre learnt on the lesser one is learnt again). A sum missing a rail is not the board's power."""
        held = self._band_quantity
        if quantity is None or (held is not None and not quantity.covers(held)):
            return False
        if held is not None and quantity != held:
            self._breach_since = None
            self._breach_values.clear()
            if self.config.power_target_w is None:
                self.power_centre_w, self._power_first_t, self._power_baseline = None, None, []
        self._band_quantity = quantity
        return True

    def _band_blind(self, sample: PowerSample, quantity: BandQuantity | None) -> list[Event]:
        """A reading of less than the band holds is not compared; a run of them is said once (a sensor event), so a
        rail lost for good does not leave the band switched off without a word."""
        self._lesser_readings += 1
        if self._lesser_readings != READINGS_BEFORE_SENSOR_WARNING or quantity is None:
            return []
        held = self._band_quantity
        lacking = (f"the measured total ({', '.join(sorted(held.parts))})" if held.measured_total and
                   not quantity.measured_total else ", ".join(sorted(held.parts - quantity.parts)) or "a rail")
        return [Event(
            t_s=sample.t_s, kind="sensor", severity="warning",
            message=f"the last {self._lesser_readings} power readings of {sample.source} lack {lacking}: the power "
                    "band compares none of them until a full reading comes back",
            evidence={"sensor": sample.source, "lacking": lacking, "readings": self._lesser_readings,
                      "band_holds": sorted(held.parts), "band_holds_measured_total": held.measured_total},
        )]

    # -- temperature ----------------------------------------------------------
    def check_temperatures(self, sample: PowerSample) -> list[Event]:
        lim = self.config.temperature
        events = self._zones_never_read(sample)
        for zone, c in sample.temps_c.items():
            if lim.zones is not None and zone not in lim.zones:
                continue
            if c > lim.critical_c:
                sev, limit = "critical", lim.critical_c
            elif c > lim.warn_c:
                sev, limit = "warning", lim.warn_c
            else:
                continue
            if not self._cooled(f"temperature:{sev}", zone, sample.t_s):
                continue
            events.append(Event(
                t_s=sample.t_s, kind="temperature", severity=sev,
                message=f"{zone} at {c:.1f} °C is above the {sev} limit {limit:g} °C",
                evidence={"rule": sev, "zone": zone, "temp_c": c, "limit_c": limit, "all_temps_c": dict(sample.temps_c)},
            ))
        return events

    def _zones_never_read(self, sample: PowerSample) -> list[Event]:
        """Watched zones that no reading has, said once: a zone name of another board (or a typo) left the rule
        watching nothing, without a word."""
        zones = self.config.temperature.zones
        if zones is None or not sample.temps_c or self._zone_readings >= READINGS_BEFORE_SENSOR_WARNING:
            return []
        self._zone_readings += 1
        self._zones_read.update(sample.temps_c)
        missing = [z for z in zones if z not in self._zones_read]
        if self._zone_readings < READINGS_BEFORE_SENSOR_WARNING or not missing:
            return []
        return [Event(
            t_s=sample.t_s, kind="sensor", severity="warning",
            message=f"temperature.zones names {', '.join(missing)}, which the first {self._zone_readings} readings of "
                    f"{sample.source} did not have (they read {', '.join(sorted(self._zones_read))}): the temperature "
                    f"rule watches {'it' if len(missing) == 1 else 'them'} not at all",
            evidence={"sensor": sample.source, "zones_missing": missing, "zones_read": sorted(self._zones_read)},
        )]

    # -- sensors --------------------------------------------------------------
    def check_sensor(self, sample: PowerSample) -> list[Event]:
        """A sensor that was readable and stopped being so (once per transition)."""
        was = self._sensor_ok.get(sample.source)
        self._sensor_ok[sample.source] = sample.available
        if was is True and not sample.available:
            return [Event(t_s=sample.t_s, kind="sensor", severity="warning",
                          message=f"sensor {sample.source} became unavailable: {sample.reason}",
                          evidence={"sensor": sample.source, "reason": sample.reason})]
        return []

    # -- throttling -----------------------------------------------------------
    def check_over_current(self, sample: PowerSample) -> list[Event]:
        """An increase of a soctherm OC counter since the previous reading: the SoC throttled on that alarm."""
        events = []
        for ch, count in sample.oc_event_counts.items():
            prev = self._oc_last.get(ch)
            self._oc_last[ch] = (sample.t_s, count)
            if prev is None or count <= prev[1]:
                continue  # first reading, nothing new, or the counter was reset (reboot, driver reload)
            delta, window_s = count - prev[1], sample.t_s - prev[0]
            meaning = OC_MEANING.get(ch, "over-current alarm")
            mw, what = sample.budget_power()
            power = f"; board power {mw / 1000:.2f} W ({what})" if mw is not None else "; no power reading"
            events.append(Event(
                t_s=sample.t_s, kind="over_current", severity="warning",
                message=f"{delta} {meaning} event(s) ({ch}) in {window_s:.1f} s" + power,
                evidence={
                    "rule": "oc_counter_increase", "channel": ch, "meaning": meaning, "events": delta, "count": count,
                    "window_s": round(window_s, 3), "throttle_enabled": sample.oc_throttle_enabled.get(ch),
                    "power_mw": None if mw is None else round(mw, 1), "power_source": what,
                    "rails_mw": {k: round(v, 1) for k, v in sample.rails_mw.items()},
                },
            ))
        return events

    def check_throttle(self, sample: PowerSample) -> list[Event]:
        """Thermal zones at a throttling trip point, and a busy GPU clocked below its power mode's ceiling."""
        cfg = self.config
        events = []
        for zone, trip in sample.trips.items():
            sev = "warning" if trip.get("type") == "passive" else "critical"
            if not self._cooled("throttle", f"trip:{zone}", sample.t_s):
                continue
            events.append(Event(
                t_s=sample.t_s, kind="throttle", severity=sev,
                message=f"{zone} at {trip['temp_c']:.1f} °C reached its {trip['type']} trip point ({trip['trip_c']:g} °C)",
                evidence={"rule": "thermal_trip", "reason": "thermal_trip", "zone": zone, **trip},
            ))
        f, ceiling, load = sample.gpu_freq_mhz, sample.gpu_max_freq_mhz, sample.gpu_load_pct
        if (f is not None and ceiling and load is not None and load >= cfg.clock_busy_pct
                and f < cfg.clock_drop_ratio * ceiling and self._cooled("throttle", "gpu_clock", sample.t_s)):
            events.append(Event(
                t_s=sample.t_s, kind="throttle", severity="warning",
                message=f"GPU at {load:.0f} % load runs at {f:.0f} MHz, {100 * f / ceiling:.0f} % of the power mode's {ceiling:.0f} MHz",
                evidence={"rule": "clock_drop", "reason": "gpu_clock", "gpu_freq_mhz": f, "gpu_max_freq_mhz": ceiling,
                          "gpu_load_pct": load, "busy_pct": cfg.clock_busy_pct, "drop_ratio": cfg.clock_drop_ratio,
                          "trips": dict(sample.trips), "oc_event_counts": dict(sample.oc_event_counts)},
            ))
        return events

    def check_sample(self, sample: PowerSample) -> list[Event]:
        return (self.check_sensor(sample) + self.check_power(sample) + self.check_temperatures(sample)
                + self.check_over_current(sample) + self.check_throttle(sample))

    def spike_threshold_ms(self, stats: WindowStats | None) -> float:
        """The value above which one observation is worth waking the watchdog for."""
        if stats is None or stats.n < self.config.min_samples:
            return math.inf
        return stats.p50_ms + self.config.jitter_budget_ms
