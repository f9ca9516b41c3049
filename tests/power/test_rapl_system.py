"""RAPL energy counters (with wrap-around) and the psutil system sensor."""

from __future__ import annotations

import pytest

from edgekit.power.sensors.rapl import RaplSensor, wrapped_delta
from edgekit.power.sensors.system import SystemSensor


def _rapl_tree(root, energy_uj: int, max_uj: int = 262143328850):
    z = root / "class/powercap/intel-rapl:0"
    z.mkdir(parents=True, exist_ok=True)
    (z / "name").write_text("package-0\n")
    (z / "max_energy_range_uj").write_text(f"{max_uj}\n")
    (z / "energy_uj").write_text(f"{energy_uj}\n")
    sub = root / "class/powercap/intel-rapl:0:0"  # a sub-zone (core): not counted twice
    sub.mkdir(parents=True, exist_ok=True)
    (sub / "name").write_text("core\n")
    (sub / "energy_uj").write_text("5\n")
    return z / "energy_uj"


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def test_rapl_power_from_two_reads(tmp_path):
    f = _rapl_tree(tmp_path, 1_000_000)
    clock = Clock()
    s = RaplSensor(tmp_path, clock=clock)
    first = s.read(0.0)
    assert first.available and first.rails_mw == {} and "priming" in first.reason
    clock.t = 0.5
    f.write_text(f"{1_000_000 + 7_500_000}\n")  # 7.5 J in 0.5 s = 15 W
    second = s.read(0.5)
    assert second.rails_mw == {"package-0": pytest.approx(15_000.0)}
    assert second.total_mw is None and second.rails_sum_mw == pytest.approx(15_000.0) and second.energy_mj == pytest.approx(7_500.0)


def test_rapl_counter_wrap(tmp_path):
    f = _rapl_tree(tmp_path, 999_000, max_uj=1_000_000)
    clock = Clock()
    s = RaplSensor(tmp_path, clock=clock)
    s.read(0.0)
    clock.t = 1.0
    f.write_text("1000\n")  # wrapped: 1000 + (1_000_000 - 999_000) = 2000 µJ
    assert s.read(1.0).rails_mw["package-0"] == pytest.approx(2.0)
    assert wrapped_delta(5, 10, 0) == -5  # no known range: reported as is


def test_rapl_absent_or_unreadable(tmp_path):
    assert not RaplSensor(tmp_path / "none").read(0.0).available
    f = _rapl_tree(tmp_path, 1)
    f.unlink()
    f.mkdir()  # reading a directory fails like a root-only file would
    r = RaplSensor(tmp_path).read(0.0)
    assert not r.available and "root-only" in r.reason


def test_system_sensor_reports_this_machine():
    import time

    s = SystemSensor(temperatures=False)
    time.sleep(0.15)
    r = s.read(0.0)
    assert r.available and r.source == "system"
    assert 0.0 < r.mem_used_mb < r.mem_total_mb
    assert 0.0 <= r.cpu_load_pct <= 100.0
    assert r.rails_mw == {} and r.total_mw is None  # psutil knows no power


def test_a_first_cpu_load_read_right_after_start_is_none_not_0():
    """#33 (low): the watchdog's first sample said cpu_load_pct 0.0: psutil had no interval to measure over."""
    r = SystemSensor(temperatures=False).read(0.0)
    assert r.available and r.cpu_load_pct is None and r.mem_total_mb > 0


def test_every_sample_of_a_stream_has_the_same_keys_absent_readings_null():
    """monitor --json's first line left cpu_load_pct out (none yet) and later lines had it: a script reading the
    stream got a KeyError on line 1. Absent readings are null, as --help says."""
    import time

    s = SystemSensor(temperatures=False)
    first = s.read(0.0).to_dict()
    time.sleep(0.15)
    second = s.read(0.15).to_dict()
    assert first["cpu_load_pct"] is None and second["cpu_load_pct"] is not None
    assert set(first) == set(second) and first["gpu_freq_mhz"] is None and first["rails_sum_mw"] is None
