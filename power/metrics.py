"""Prometheus families for what the watchdog sees (next to the tracker's latency histograms).

The runtime's ``/metrics`` route serves ``generate_latest(watchdog.registry)``;
``edgekit monitor --url`` reads the same names back (see ``scrape.py``).

Absent means absent: the power, temperature, load and clock families are
produced at scrape time from the latest merged sample (a custom collector), so a
reading nobody took is not exported at all -- never as a 0 that a dashboard
would plot as "0 W". ``edgekit_sensor_available{sensor}`` says, per sensor
source (present or probed and absent), whether its last read succeeded, so a
missing family can be told apart from a broken exporter.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from edgekit.power.events import Event
from edgekit.power.latency import WindowStats
from edgekit.power.sample import PowerSample, rails_sum_label

NS = "edgekit"
RAIL_GAUGE = f"{NS}_power_rail_milliwatts"
TOTAL_GAUGE = f"{NS}_power_total_milliwatts"
RAILS_SUM_GAUGE = f"{NS}_power_rails_sum_milliwatts"
TEMP_GAUGE = f"{NS}_temperature_celsius"
GPU_LOAD_GAUGE = f"{NS}_gpu_load_percent"
GPU_CLOCK_GAUGE = f"{NS}_gpu_clock_megahertz"
GPU_CLOCK_MAX_GAUGE = f"{NS}_gpu_clock_max_megahertz"
OC_COUNTER = f"{NS}_overcurrent_events"  # exposed as ..._total: the board's own cumulative counter
SENSOR_AVAILABLE_GAUGE = f"{NS}_sensor_available"
QUANTILE_GAUGE = f"{NS}_latency_window_milliseconds"
JITTER_GAUGE = f"{NS}_latency_jitter_milliseconds"
EVENTS_COUNTER = f"{NS}_watchdog_events"  # exposed as ..._total
RATE_GAUGE = f"{NS}_watchdog_sample_rate_hertz"


class SensorCollector(Collector):
    """Yields the sensor families from the latest sample at scrape time (nothing for what was not read)."""

    def __init__(self) -> None:
        self.sample: PowerSample | None = None
        self.sources: dict[str, bool] = {}  # sensor name -> last read succeeded

    def collect(self):
        avail = GaugeMetricFamily(SENSOR_AVAILABLE_GAUGE, "1 when the sensor's last read succeeded, 0 when it is absent or failed.", labels=["sensor"])
        for name, ok in sorted(self.sources.items()):
            avail.add_metric([name], 1.0 if ok else 0.0)
        yield avail
        s = self.sample
        if s is None or not s.available:
            return
        if s.rails_mw:
            g = GaugeMetricFamily(RAIL_GAUGE, "Power per rail, mW (measured by the board's monitors).", labels=["rail"])
            for rail, mw in s.rails_mw.items():
                g.add_metric([rail], mw)
            yield g
        if s.total_mw is not None:
            yield GaugeMetricFamily(TOTAL_GAUGE, "Board input power, mW (the input rail or the device's own figure); absent where not measured.", value=s.total_mw)
        if s.rails_sum_mw is not None:
            g = GaugeMetricFamily(RAILS_SUM_GAUGE, "Sum of the named rails, mW, where the board measures no input rail (not the board's total).", labels=["rails"])
            g.add_metric([rails_sum_label(s.rails_sum_of)], s.rails_sum_mw)
            yield g
        if s.temps_c:
            g = GaugeMetricFamily(TEMP_GAUGE, "Temperature per zone, degrees C.", labels=["zone"])
            for zone, c in s.temps_c.items():
                g.add_metric([zone], c)
            yield g
        for name, doc, v in ((GPU_LOAD_GAUGE, "GPU load, percent.", s.gpu_load_pct),
                             (GPU_CLOCK_GAUGE, "GPU clock, MHz.", s.gpu_freq_mhz),
                             (GPU_CLOCK_MAX_GAUGE, "GPU clock ceiling of the power mode, MHz.", s.gpu_max_freq_mhz)):
            if v is not None:
                yield GaugeMetricFamily(name, doc, value=v)
        if s.oc_event_counts:
            c = CounterMetricFamily(OC_COUNTER, "Over-current/under-voltage throttling events counted by the SoC since boot.", labels=["channel"])
            for ch, n in s.oc_event_counts.items():
                c.add_metric([ch], float(n))
            yield c


class WatchdogMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self.sensors = SensorCollector()
        registry.register(self.sensors)
        self.quantile = Gauge(QUANTILE_GAUGE, "Latency percentile over the watchdog's rolling window, ms.", ["metric", "quantile"], registry=registry)
        self.jitter = Gauge(JITTER_GAUGE, "Latency jitter (p99 - p50) over the rolling window, ms.", ["metric"], registry=registry)
        self.events = Counter(EVENTS_COUNTER, "Watchdog events raised.", ["kind", "severity"], registry=registry)
        self.rate = Gauge(RATE_GAUGE, "The watchdog's current sampling rate, Hz.", registry=registry)

    def update_sample(self, s: PowerSample) -> None:
        # one reference swap: the families are built when (and only when) someone scrapes
        self.sensors.sample = s

    def update_sources(self, sources: dict[str, bool]) -> None:
        self.sensors.sources.update(sources)

    def update_latency(self, stats: WindowStats) -> None:
        for q, v in (("0.5", stats.p50_ms), ("0.95", stats.p95_ms), ("0.99", stats.p99_ms)):
            self.quantile.labels(metric=stats.metric, quantile=q).set(v)
        self.jitter.labels(metric=stats.metric).set(stats.jitter_ms)

    def count_event(self, e: Event) -> None:
        self.events.labels(kind=e.kind, severity=e.severity).inc()
