"""Read a server's ``/metrics`` (Prometheus text) for ``edgekit monitor --url``.

Only the given URL is fetched (http or https, no redirects followed). Latency
percentiles come from the histogram buckets the tracker exports: the bucket
counts added over the last ``window_s`` (the watchdog's rolling window: the
difference from the oldest scrape still inside it) give the window's
distribution, and quantiles are interpolated inside a bucket the way
Prometheus' ``histogram_quantile`` does, so their resolution is the bucket
width (1 ms up to 30 ms). Power, temperatures and event counts come from the
gauges; a family the server does not export (an absent sensor) stays absent
(None), and ``sensors`` gives each source's ``edgekit_sensor_available``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from edgekit.errors import SensorError
from edgekit.http_url import http_url_problem
from edgekit.power.latency import _PROM_NAMES
from edgekit.power.metrics import (
    EVENTS_COUNTER,
    GPU_LOAD_GAUGE,
    RAIL_GAUGE,
    RAILS_SUM_GAUGE,
    SENSOR_AVAILABLE_GAUGE,
    TEMP_GAUGE,
    TOTAL_GAUGE,
)

DEFAULT_URL = "http://127.0.0.1:8000/metrics"


def check_url(url: str) -> str:
    problem = http_url_problem(url)
    if problem is not None:
        raise SensorError(f"--url {url!r} {problem}", hint=f"e.g. {DEFAULT_URL}")
    return url


def fetch(url: str, timeout_s: float = 2.0) -> str:
    import httpx

    try:
        r = httpx.get(check_url(url), timeout=timeout_s, follow_redirects=False)
    except httpx.HTTPError as e:
        raise SensorError(f"cannot read {url}: {type(e).__name__}: {e}", hint="is the edgekit server running, and does it serve Prometheus text at that URL?") from e
    if r.status_code != 200:
        raise SensorError(f"{url} answered HTTP {r.status_code}", hint="point --url at the server's /metrics route")
    return r.text


@dataclass
class Histogram:
    buckets: list[tuple[float, float]] = field(default_factory=list)  # (upper bound s, cumulative count)
    count: float = 0.0
    sum: float = 0.0


@dataclass
class Scrape:
    histograms: dict[str, Histogram] = field(default_factory=dict)
    gauges: dict[str, dict[tuple[tuple[str, str], ...], float]] = field(default_factory=dict)


def parse(text: str) -> Scrape:
    out = Scrape()
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as e:
        raise SensorError(f"the /metrics answer is not Prometheus text: {e}") from e
    for fam in families:
        if fam.type == "histogram":
            h = out.histograms.setdefault(fam.name, Histogram())
            for s in fam.samples:
                if s.name.endswith("_bucket"):
                    h.buckets.append((float(s.labels["le"]), s.value))
                elif s.name.endswith("_count"):
                    h.count = s.value
                elif s.name.endswith("_sum"):
                    h.sum = s.value
            h.buckets.sort()
        else:
            for s in fam.samples:
                out.gauges.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' interpolation: the q-quantile (in the buckets' unit) from cumulative counts."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if math.isinf(le):
                return prev_le  # beyond the last finite bound: the best we can say
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def delta(now: Histogram, before: Histogram | None) -> list[tuple[float, float]]:
    if before is None or len(before.buckets) != len(now.buckets) or now.count < before.count:
        return now.buckets  # first scrape, or the server restarted: use everything
    return [(le, c - cb) for (le, c), (_, cb) in zip(now.buckets, before.buckets)]


class AttachedSource:
    """Polls one URL; each poll returns the rolling window's latency percentiles and the current gauges."""

    def __init__(self, url: str = DEFAULT_URL, timeout_s: float = 2.0, window_s: float = 10.0, clock=time.monotonic):
        self.url = check_url(url)
        self.timeout_s = timeout_s
        self.window_s = window_s
        self.clock = clock
        self._prev: Scrape | None = None
        self._history: deque[tuple[float, Scrape]] = deque()

    def _window_base(self, now: float) -> tuple[float, Scrape] | None:
        """The oldest scrape inside the rolling window (older ones are dropped)."""
        while len(self._history) > 1 and now - self._history[0][0] > self.window_s:
            self._history.popleft()
        if self._history and now - self._history[0][0] > self.window_s:
            self._history.popleft()
        return self._history[0] if self._history else None

    def poll(self) -> dict:
        scrape = parse(fetch(self.url, self.timeout_s))
        now = self.clock()
        base = self._window_base(now) or ((now, self._prev) if self._prev is not None else None)
        view: dict = {"url": self.url, "latency": {}, "rails_mw": {}, "temps_c": {}, "events_total": {}, "events_new": {},
                      "sensors": {}, "window_s": None if base is None else round(now - base[0], 3)}
        for metric, (name, _) in _PROM_NAMES.items():
            h = scrape.histograms.get(f"edgekit_{name}")
            if h is None:
                continue
            buckets = delta(h, base[1].histograms.get(f"edgekit_{name}") if base else None)
            n = buckets[-1][1] if buckets else 0
            if n <= 0:
                view["latency"][metric] = {"n": 0}
                continue
            qs = {f"p{int(q * 100)}_ms": 1000.0 * histogram_quantile(q, buckets) for q in (0.5, 0.95, 0.99)}
            qs["jitter_ms"] = qs["p99_ms"] - qs["p50_ms"]
            view["latency"][metric] = {"n": int(n), **qs}
        for labels, v in scrape.gauges.get(RAIL_GAUGE, {}).items():
            view["rails_mw"][dict(labels)["rail"]] = v
        view["total_mw"] = scrape.gauges.get(TOTAL_GAUGE, {}).get(())
        view["rails_sum_mw"], view["rails_sum_of"] = None, []
        for labels, v in scrape.gauges.get(RAILS_SUM_GAUGE, {}).items():
            label = dict(labels).get("rails", "")
            view["rails_sum_mw"] = v
            view["rails_sum_of"] = label.removeprefix("sum of ").split(" + ") if label else []
        for labels, v in scrape.gauges.get(TEMP_GAUGE, {}).items():
            view["temps_c"][dict(labels)["zone"]] = v
        view["gpu_load_pct"] = scrape.gauges.get(GPU_LOAD_GAUGE, {}).get(())
        for labels, v in scrape.gauges.get(SENSOR_AVAILABLE_GAUGE, {}).items():
            view["sensors"][dict(labels).get("sensor", "?")] = bool(v)
        before = self._prev.gauges.get(f"{EVENTS_COUNTER}_total", {}) if self._prev else {}
        for labels, v in scrape.gauges.get(f"{EVENTS_COUNTER}_total", {}).items():
            d = dict(labels)
            key = f"{d.get('kind')}/{d.get('severity')}"
            view["events_total"][key] = v
            new = v - before.get(labels, 0.0) if v >= before.get(labels, 0.0) else v  # a restart resets counters
            if new > 0:
                view["events_new"][key] = new
        self._prev = scrape
        self._history.append((now, scrape))
        return view
