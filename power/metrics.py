"""Prometheus gauges for what the watchdog sees (next to the tracker's latency histograms).

The runtime's ``/metrics`` route serves ``generate_latest(watchdog.registry)``;
``edgekit monitor --url`` reads the same names back (see ``scrape.py``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from edgekit.power.events import Event
from edgekit.power.latency import WindowStats
from edgekit.power.sample import PowerSample

NS = "edgekit"
RAIL_GAUGE = f"{NS}_power_rail_milliwatts"
TOTAL_GAUGE = f"{NS}_power_total_milliwatts"
TEMP_GAUGE = f"{NS}_temperature_celsius"
GPU_LOAD_GAUGE = f"{NS}_gpu_load_percent"
QUANTILE_GAUGE = f"{NS}_latency_window_milliseconds"
JITTER_GAUGE = f"{NS}_latency_jitter_milliseconds"
EVENTS_COUNTER = f"{NS}_watchdog_events"  # exposed as ..._total
RATE_GAUGE = f"{NS}_watchdog_sample_rate_hertz"


class WatchdogMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self.rail = Gauge(RAIL_GAUGE, "Power per rail, mW.", ["rail"], registry=registry)
        self.total = Gauge(TOTAL_GAUGE, "Total board power, mW (the input rail, else the sum of rails).", registry=registry)
        self.temp = Gauge(TEMP_GAUGE, "Temperature per zone, degrees C.", ["zone"], registry=registry)
        self.gpu_load = Gauge(GPU_LOAD_GAUGE, "GPU load, percent.", registry=registry)
        self.quantile = Gauge(QUANTILE_GAUGE, "Latency percentile over the watchdog's rolling window, ms.", ["metric", "quantile"], registry=registry)
        self.jitter = Gauge(JITTER_GAUGE, "Latency jitter (p99 - p50) over the rolling window, ms.", ["metric"], registry=registry)
        self.events = Counter(EVENTS_COUNTER, "Watchdog events raised.", ["kind", "severity"], registry=registry)
        self.rate = Gauge(RATE_GAUGE, "The watchdog's current sampling rate, Hz.", registry=registry)
        self._rails: dict = {}
        self._zones: dict = {}

    def update_sample(self, s: PowerSample) -> None:
        # labelled children are looked up once and kept: labels() costs a lock and a tuple each call
        for rail, mw in s.rails_mw.items():
            child = self._rails.get(rail)
            if child is None:
                child = self._rails[rail] = self.rail.labels(rail=rail)
            child.set(mw)
        if s.total_mw is not None:
            self.total.set(s.total_mw)
        for zone, c in s.temps_c.items():
            child = self._zones.get(zone)
            if child is None:
                child = self._zones[zone] = self.temp.labels(zone=zone)
            child.set(c)
        if s.gpu_load_pct is not None:
            self.gpu_load.set(s.gpu_load_pct)

    def update_latency(self, stats: WindowStats) -> None:
        for q, v in (("0.5", stats.p50_ms), ("0.95", stats.p95_ms), ("0.99", stats.p99_ms)):
            self.quantile.labels(metric=stats.metric, quantile=q).set(v)
        self.jitter.labels(metric=stats.metric).set(stats.jitter_ms)

    def count_event(self, e: Event) -> None:
        self.events.labels(kind=e.kind, severity=e.severity).inc()
