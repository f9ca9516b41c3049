"""Rolling latency windows, Prometheus histograms, and the adaptive sampling rate."""

from __future__ import annotations

import math

import pytest

from edgekit.power.latency import LatencyTracker, timed_stream
from edgekit.power.sampler import AdaptiveSampler, moved

pytestmark = pytest.mark.serial  # it times wall-clock behaviour: scripts/test.sh runs it alone, after the parallel phase


class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_percentiles_jitter_and_std_of_a_known_window():
    tr = LatencyTracker(window_s=60, clock=FakeClock())
    for v in range(1, 101):  # 1..100 ms
        tr.record("token", float(v))
    s = tr.stats("token")
    assert s.n == 100
    assert s.p50_ms == pytest.approx(50.5)  # linear interpolation between 50 and 51
    assert s.p99_ms == pytest.approx(99.01)
    assert s.jitter_ms == pytest.approx(48.51)
    assert s.std_ms == pytest.approx(math.sqrt((100**2 - 1) / 12))  # population std of 1..n
    assert (s.min_ms, s.max_ms) == (1.0, 100.0)


def test_window_forgets_old_observations():
    clock = FakeClock()
    tr = LatencyTracker(window_s=10, clock=clock)
    tr.record("token", 50.0)
    clock.t += 11
    tr.record("token", 5.0)
    tr.record("token", 7.0)
    s = tr.stats("token")
    assert s.n == 2 and s.max_ms == 7.0
    clock.t += 20
    assert tr.stats("token") is None


def test_since_returns_only_new_observations():
    tr = LatencyTracker(clock=FakeClock())
    for v in (1.0, 2.0, 3.0):
        tr.record("token", v)
    seq = tr.count("token")
    tr.record("token", 4.0)
    assert [v for _, v in tr.since("token", seq)] == [4.0]
    assert tr.since("token", tr.count("token")) == []


def test_prometheus_histogram_resolves_milliseconds():
    tr = LatencyTracker(clock=FakeClock())
    for v in (4.2, 4.8, 5.1, 7.9):
        tr.record("token", v)
    get = tr.registry.get_sample_value
    name = "edgekit_token_latency_seconds_bucket"
    assert get(name, {"le": "0.004"}) == 0
    assert get(name, {"le": "0.005"}) == 2  # 4.2 and 4.8 ms fall in (4, 5] ms
    assert get(name, {"le": "0.006"}) == 3
    assert get(name, {"le": "0.008"}) == 4
    assert get("edgekit_token_latency_seconds_sum") == pytest.approx((4.2 + 4.8 + 5.1 + 7.9) / 1000)


def test_value_above_the_threshold_wakes_the_watchdog():
    tr = LatencyTracker(clock=FakeClock())
    tr.record("token", 100.0)
    assert not tr.wake.is_set()  # no threshold yet (window too small)
    tr.spike_threshold_ms["token"] = 10.0
    tr.record("token", 9.0)
    assert not tr.wake.is_set()
    tr.record("token", 11.0)
    assert tr.wake.is_set()


def test_timed_stream_records_ttft_gaps_and_total():
    clock = FakeClock(0.0)
    tr = LatencyTracker(clock=FakeClock())

    def tokens():
        for dt in (0.050, 0.010, 0.012):  # the first token after 50 ms, then 10 and 12 ms apart
            clock.t += dt
            yield "x"

    assert list(timed_stream(tokens(), tr, clock=clock)) == ["x", "x", "x"]
    assert tr.values("ttft") == [pytest.approx(50.0)]
    assert tr.values("token") == [pytest.approx(10.0), pytest.approx(12.0)]
    assert tr.values("request") == [pytest.approx(72.0)]


def test_sampler_goes_fast_on_activity_and_back_to_slow_after_hold():
    clock = FakeClock(0.0)
    s = AdaptiveSampler(fast_hz=1000, slow_hz=10, hold_s=2.0, clock=clock)
    assert s.mode() == "slow" and s.period_s() == pytest.approx(0.1)
    s.note_activity()
    assert s.mode() == "fast" and s.period_s() == pytest.approx(0.001)
    clock.t = 1.9
    assert s.mode() == "fast"
    clock.t = 2.1
    assert s.mode() == "slow"
    assert s.switches == 2


def test_forced_mode_and_bad_rates():
    assert AdaptiveSampler(force="fast").period_s() == pytest.approx(0.001)
    with pytest.raises(ValueError, match="fast_hz >= slow_hz"):
        AdaptiveSampler(fast_hz=5, slow_hz=10)


@pytest.mark.parametrize(
    "prev, cur, expected",
    [(10.0, 10.4, False), (10.0, 11.5, True), (0.1, 0.3, False), (None, 1.0, True), (None, None, False)],
)
def test_moved_needs_both_relative_and_absolute_change(prev, cur, expected):
    assert moved(prev, cur, rel=0.1, abs_=0.5) is expected


def test_window_quantiles_match_numpy_linear_percentiles():
    import numpy as np

    from edgekit.power.latency import window_stats

    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 17, 511, 512, 3000):  # both the pure-Python and the numpy path
        a = rng.gamma(2.0, 3.0, size=n)
        for values in (a, a.tolist()):
            s = window_stats("token", values, 10.0)
            assert [s.p50_ms, s.p95_ms, s.p99_ms] == pytest.approx(list(np.percentile(a, [50, 95, 99])))
            assert (s.min_ms, s.max_ms) == (a.min(), a.max())
            assert (s.mean_ms, s.std_ms) == (pytest.approx(a.mean()), pytest.approx(a.std()))
