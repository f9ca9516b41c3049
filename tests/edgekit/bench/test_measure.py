"""Timers and the energy meter (with an injected sensor standing in for NVML)."""

from __future__ import annotations

import time

import pytest
import torch

from edgekit.bench.measure import EnergyMeter, timed
from edgekit.power.sample import PowerSample
from edgekit.power.sensors.base import Sensor


class CounterSensor(Sensor):
    """A board whose energy counter integrates a constant draw of ``watts`` in real time."""

    name = "counter"

    def __init__(self, watts: float):
        self.watts = watts
        self.t0 = time.perf_counter()

    def _read(self, t):
        return PowerSample(t_s=t, source=self.name, total_mw=self.watts * 1000,
                           energy_mj=(time.perf_counter() - self.t0) * self.watts * 1000)


class NoCounterSensor(Sensor):
    name = "nocounter"

    def _read(self, t):
        return PowerSample.unavailable(self.name, "no NVML here", t)


def test_energy_window_recovers_the_power_of_the_board():
    meter = EnergyMeter(CounterSensor(watts=250.0))
    out, window, seconds = meter.measure(lambda: time.sleep(0.05) or "done", torch.device("cpu"))
    assert out == "done" and seconds >= 0.05
    assert window.power_w == pytest.approx(250.0, rel=0.02)
    assert window.energy_mj == pytest.approx(250.0 * seconds * 1000, rel=0.02)


def test_meter_without_counter_reports_why_and_measures_no_energy():
    meter = EnergyMeter(NoCounterSensor())
    assert not meter.available and "no NVML here" in meter.reason
    _, window, _ = meter.measure(lambda: None, torch.device("cpu"))
    assert window is None


def test_timed_returns_the_result_and_the_duration():
    out, s = timed(lambda: time.sleep(0.02) or 7, torch.device("cpu"))
    assert out == 7 and 0.02 <= s < 1.0


def test_the_copy_runs_as_memcpy_or_as_an_elementwise_kernel_and_says_which():
    import pytest
    import torch

    from edgekit.bench.measure import copy_bandwidth

    for via, says in (("memcpy", "cudaMemcpyAsync"), ("kernel", "elementwise kernel")):
        bw = copy_bandwidth(torch.device("cpu"), nbytes=1 << 20, repeats=2, via=via)  # the CPU: plumbing only
        assert bw["buffer_bytes"] == 1 << 20 and bw["bytes_per_s"] > 0 and says in bw["method"]
    with pytest.raises(ValueError, match="expected one of"):
        copy_bandwidth(torch.device("cpu"), nbytes=1 << 10, via="dma")
