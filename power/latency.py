"""Latency per request and per token, in rolling windows, with Prometheus histograms.

Three metrics, all in milliseconds here (seconds in Prometheus, its base unit):
``ttft`` (time to first token), ``token`` (the time between two tokens of one
stream) and ``request`` (a whole request). Each keeps a time-bounded window of
observations; ``stats`` gives p50/p95/p99, mean, standard deviation and the
jitter p99 - p50 of that window.

``record`` runs on the inference thread, so it is O(1): append under a lock,
observe the histogram, compare with a threshold the watchdog set. Percentiles
are computed on the watchdog's thread. When a value exceeds the threshold,
``wake`` is set so a watchdog that sleeps at its slow rate looks at once.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass

import numpy as np
from prometheus_client import CollectorRegistry, Histogram

METRICS = ("ttft", "token", "request")
_PROM_NAMES = {
    # the one TTFT family of /metrics: the server keeps no latency histograms of its own (it records into this
    # tracker), so the name is defined once -- a family twice is an invalid exposition (strict parsers reject it)
    "ttft": ("time_to_first_token_seconds", "Time from request start to its first token."),
    "token": ("token_latency_seconds", "Time between two consecutive tokens of one stream."),
    "request": ("request_latency_seconds", "Time for a whole request."),
}
# 1 ms steps up to 30 ms, where decode steps of small models on Orin live and where
# a 5 ms jitter budget has to be resolved; coarser above for prefill and whole requests.
DEFAULT_BUCKETS_S = (
    0.0005, *[i / 1000 for i in range(1, 31)], 0.035, 0.04, 0.045, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1,
    0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0,
)


@dataclass(frozen=True)
class WindowStats:
    metric: str
    n: int
    window_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float

    @property
    def jitter_ms(self) -> float:
        """p99 - p50: how far the slow tail sits above the typical value."""
        return self.p99_ms - self.p50_ms

    def to_dict(self) -> dict:
        d = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}
        d["jitter_ms"] = round(self.jitter_ms, 4)
        return d


# Below this many values plain Python beats numpy: each numpy call costs tens of
# microseconds of dispatch, more when the watchdog wakes with cold caches.
_NUMPY_FROM = 512


def window_stats(metric: str, values_ms: Iterable[float] | np.ndarray, window_s: float) -> WindowStats | None:
    """Percentiles with numpy's default (linear) method, mean, population std, min, max."""
    if isinstance(values_ms, np.ndarray) and values_ms.size >= _NUMPY_FROM:
        a = np.sort(values_ms)
        mean, std = float(a.mean()), float(a.std())
    else:
        a = sorted(values_ms.tolist() if isinstance(values_ms, np.ndarray) else values_ms)
        if not a:
            return None
        mean = math.fsum(a) / len(a)
        std = math.sqrt(math.fsum((x - mean) ** 2 for x in a) / len(a))
    n = len(a)
    if n == 0:
        return None
    return WindowStats(metric, n, window_s, _linear_quantile(a, 0.50), _linear_quantile(a, 0.95),
                       _linear_quantile(a, 0.99), mean, std, float(a[0]), float(a[-1]))


def _linear_quantile(sorted_a, q: float) -> float:
    n = len(sorted_a)
    pos = q * (n - 1)
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    return float(sorted_a[lo] + (sorted_a[hi] - sorted_a[lo]) * (pos - lo))


class LatencyTracker:
    def __init__(
        self,
        window_s: float = 10.0,
        max_window_samples: int = 8192,
        registry: CollectorRegistry | None = None,
        namespace: str = "edgekit",
        buckets_s: tuple[float, ...] = DEFAULT_BUCKETS_S,
        clock=time.monotonic,
    ):
        self.window_s = window_s
        self.clock = clock
        self.registry = registry if registry is not None else CollectorRegistry()
        self._lock = threading.Lock()
        # times and values in two deques, so a window becomes a numpy array without building tuples
        self._t: dict[str, deque[float]] = {m: deque(maxlen=max_window_samples) for m in METRICS}
        self._v: dict[str, deque[float]] = {m: deque(maxlen=max_window_samples) for m in METRICS}
        self._counts: dict[str, int] = {m: 0 for m in METRICS}
        # Above this a value counts as a possible spike; the watchdog keeps it at p50 + budget.
        self.spike_threshold_ms: dict[str, float] = {m: math.inf for m in METRICS}
        self.wake = threading.Event()
        self.watchdog_metrics = None  # the gauges of the first Watchdog on this registry (shared by later ones)
        self._hist = {
            m: Histogram(_PROM_NAMES[m][0], _PROM_NAMES[m][1], namespace=namespace, buckets=buckets_s, registry=self.registry)
            for m in METRICS
        }

    def record(self, metric: str, value_ms: float, t: float | None = None) -> None:
        """One observation (called from the inference thread; cheap)."""
        t = self.clock() if t is None else t
        ts, vs = self._t[metric], self._v[metric]
        with self._lock:
            ts.append(t)
            vs.append(value_ms)
            self._counts[metric] += 1
            self._prune(ts, vs, t)
        self._hist[metric].observe(value_ms / 1000.0)
        if value_ms > self.spike_threshold_ms[metric]:
            self.wake.set()

    def record_request(self, ttft_s: float, total_s: float, token_times_s: Iterable[float] = ()) -> None:
        """A finished request at once (for callers that time it themselves, e.g. GenerationStats)."""
        self.record("ttft", ttft_s * 1000.0)
        for dt in token_times_s:
            self.record("token", dt * 1000.0)
        self.record("request", total_s * 1000.0)

    def _prune(self, ts: deque[float], vs: deque[float], now: float) -> None:
        horizon = now - self.window_s
        while ts and ts[0] < horizon:
            ts.popleft()
            vs.popleft()

    def count(self, metric: str) -> int:
        return self._counts[metric]

    def since(self, metric: str, seq: int) -> list[tuple[float, float]]:
        """(time, value) of the observations recorded after the first ``seq`` that are still in the window."""
        with self._lock:
            n_new = self._counts[metric] - seq
            ts, vs = self._t[metric], self._v[metric]
            if n_new <= 0:
                return []
            n = len(ts)
            return [(ts[i], vs[i]) for i in range(n - min(n_new, n), n)]

    def _window(self, metric: str, now: float | None) -> list[float] | np.ndarray:
        now = self.clock() if now is None else now
        with self._lock:
            ts, vs = self._t[metric], self._v[metric]
            self._prune(ts, vs, now)
            if len(vs) >= _NUMPY_FROM:
                return np.fromiter(vs, dtype=np.float64, count=len(vs))
            return list(vs)

    def values(self, metric: str, now: float | None = None) -> list[float]:
        w = self._window(metric, now)
        return w.tolist() if isinstance(w, np.ndarray) else w

    def stats(self, metric: str, now: float | None = None) -> WindowStats | None:
        return window_stats(metric, self._window(metric, now), self.window_s)

    def snapshot(self, now: float | None = None) -> dict[str, WindowStats]:
        out = {}
        for m in METRICS:
            s = self.stats(m, now)
            if s is not None:
                out[m] = s
        return out


def timed_stream(tokens: Iterable, tracker: LatencyTracker, clock=time.perf_counter) -> Iterator:
    """Yield from a token stream while recording ttft, the gap between tokens, and the total.

    The gap is measured between the moments the stream hands out consecutive
    tokens, which is what a client sees (model step + sampling + any stall).
    """
    t0 = clock()
    last = None
    for tok in tokens:
        now = clock()
        if last is None:
            tracker.record("ttft", (now - t0) * 1000.0)
        else:
            tracker.record("token", (now - last) * 1000.0)
        last = now
        yield tok
    tracker.record("request", (clock() - t0) * 1000.0)
