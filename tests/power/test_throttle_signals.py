"""Over-current counters, trip points, clock drops, JetPack 4 rails and placeholder zones, on recorded trees."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edgekit.power.policy import PolicyConfig, PolicyEngine
from edgekit.power.sample import PowerSample
from edgekit.power.sensors.discover import local_sensors
from edgekit.power.sensors.hwmon_ina3221 import Ina3221Sensor
from edgekit.power.sensors.soctherm_oc import SocthermOcSensor
from edgekit.power.sensors.tegrastats import replay_log
from edgekit.power.sensors.thermal import ThermalSensor
from edgekit.power.watchdog import Watchdog

FIX = Path(__file__).parent / "fixtures"
SYSFS = FIX / "sysfs"
OC_TREE = SYSFS / "orin-nano-super-oc"
NANO_IN_MW = 5104 * 1120 / 1000  # VDD_IN of the Nano tree, mV x mA


@pytest.fixture
def board(tmp_path):
    d = tmp_path / "board"
    shutil.copytree(OC_TREE, d)
    return d


def _bump(board: Path, channel: str, count: int) -> None:
    (board / f"class/hwmon/hwmon3/{channel}_event_cnt").write_text(f"{count}\n")


def test_soctherm_oc_counters_and_throttle_enables_are_read():
    s = SocthermOcSensor(OC_TREE).read(0.0)
    assert s.available and s.source == "soctherm_oc"
    assert s.oc_event_counts == {"oc1": 0, "oc2": 0, "oc3": 37}
    assert s.oc_throttle_enabled == {"oc1": True, "oc2": True, "oc3": True}
    assert not SocthermOcSensor(SYSFS / "orin-nano-8gb").available()  # the older tree has no such device


def test_increasing_oc_counters_become_events_with_the_power_at_the_time(board):
    sensors, _ = local_sensors(board)
    assert [s.name for s in sensors] == ["ina3221", "thermal", "gpu_load", "soctherm_oc"]
    wd = Watchdog(sensors=sensors, policy=PolicyConfig(power_target_w=6.0, clock_busy_pct=100))  # 98.7 % load: clock rule off here
    assert [e.kind for e in wd.tick(now_mono=10.0, now_wall=1000.0)] == []  # the first reading is the baseline
    wd.tick(now_mono=10.5, now_wall=1000.5)  # rails are read (50 ms floor), the OC counters (1 s) are not due
    _bump(board, "oc3", 42)
    _bump(board, "oc1", 2)
    events = wd.tick(now_mono=11.0, now_wall=1001.0)
    oc = sorted((e for e in events if e.kind == "over_current"), key=lambda e: e.evidence["channel"])
    assert [(e.evidence["channel"], e.evidence["events"], e.evidence["meaning"]) for e in oc] == [
        ("oc1", 2, "under-voltage"), ("oc3", 5, "instantaneous over-current")]
    ev = oc[1].evidence
    assert ev["count"] == 42 and ev["window_s"] == pytest.approx(1.0) and ev["throttle_enabled"] is True
    assert ev["power_mw"] == pytest.approx(NANO_IN_MW, abs=0.1) and ev["power_source"] == "VDD_IN"
    assert "VDD_CPU_GPU_CV" in ev["rails_mw"]
    assert wd.tick(now_mono=12.0, now_wall=1002.0) == []  # no increase, no event
    _bump(board, "oc3", 3)  # counters restart at boot: a drop is a reset, not an event
    assert [e for e in wd.tick(now_mono=13.0, now_wall=1003.0) if e.kind == "over_current"] == []


def test_busy_gpu_below_its_power_mode_ceiling_is_a_throttle_event():
    sensors, _ = local_sensors(OC_TREE)
    board = Watchdog(sensors=sensors)
    (e,) = [e for e in board.tick(now_mono=1.0, now_wall=100.0) if e.kind == "throttle"]
    assert e.evidence["reason"] == "gpu_clock"
    assert e.evidence["gpu_freq_mhz"] == pytest.approx(624.75) and e.evidence["gpu_max_freq_mhz"] == pytest.approx(1020.0)
    assert e.evidence["gpu_load_pct"] == pytest.approx(98.7)
    # an idle GPU clocked down by DVFS is not throttled
    idle = PowerSample(t_s=0.0, source="x", gpu_load_pct=3.0, gpu_freq_mhz=306.0, gpu_max_freq_mhz=1020.0)
    assert PolicyEngine().check_throttle(idle) == []


def test_zone_at_a_passive_trip_point_is_a_throttle_event_and_active_trips_are_not(board):
    (board / "class/thermal/thermal_zone0/temp").write_text("47000\n")  # above the active (fan) trip only
    assert ThermalSensor(board).read(0.0).trips == {}
    (board / "class/thermal/thermal_zone0/temp").write_text("99500\n")
    s = ThermalSensor(board).read(0.0)
    assert s.trips == {"cpu": {"type": "passive", "trip_c": 99.0, "temp_c": 99.5}}
    (e,) = PolicyEngine().check_throttle(s)
    assert e.kind == "throttle" and e.severity == "warning" and e.evidence["reason"] == "thermal_trip" and e.evidence["zone"] == "cpu"
    (board / "class/thermal/thermal_zone1/temp").write_text("105000\n")
    crit = ThermalSensor(board).read(0.0)
    assert crit.trips["gpu"]["type"] == "critical"
    assert {e.severity for e in PolicyEngine().check_throttle(crit)} == {"warning", "critical"}


def test_jetpack4_ina3221x_layout_rails_and_input_total():
    s = Ina3221Sensor(SYSFS / "jetson-nano-jp4").read(0.0)
    assert s.rails_mw == pytest.approx({"POM_5V_IN": 5048 * 1240 / 1000, "POM_5V_GPU": 5032 * 56 / 1000, "POM_5V_CPU": 5040 * 316 / 1000})
    assert s.total_source == "POM_5V_IN" and s.total_mw == pytest.approx(6259.52) and s.rails_sum_mw is None


def test_pmic_placeholder_zone_is_kept_apart_and_raises_no_alarm():
    s = ThermalSensor(SYSFS / "jetson-nano-jp4").read(0.0)
    assert s.placeholder_temps_c == {"pmic-die": 100.0}
    assert s.temps_c == {"ao": 30.5, "cpu": 25.0, "gpu": 24.5, "pll": 24.0, "thermal-fan-est": 24.75}
    assert PolicyEngine().check_temperatures(s) == []
    # the same zone name with a value that is not the placeholder is a real reading
    hot = replay_log(FIX / "tegrastats/xavier-nx-jp4.log").samples[0]
    assert hot.placeholder_temps_c == {"pmic": 100.0} and PolicyEngine().check_temperatures(hot) == []


def test_jetpack72_recorded_line_temperatures_averages_third_value_and_no_total():
    (s,) = replay_log(FIX / "tegrastats/agx-orin-64gb-jp72.log").samples
    assert s.temps_c == {"cpu": 52.968, "soc2": 48.406, "soc0": 49.531, "gpu": 47.625}
    assert s.rails_mw == {"VDD_GPU_SOC": 5139.0, "VDD_CPU_CV": 3268.0, "VIN_SYS_5V0": 5500.0}
    assert s.rails_avg_mw == s.rails_mw and s.rails_third_mw == s.rails_mw
    assert s.total_mw is None and s.rails_sum_mw == 5139 + 3268 + 5500  # AGX Orin: no input rail
    assert s.gpu_load_pct == 12 and s.gpu_freq_mhz == 1300 and s.emc_freq_mhz == 3199
    assert s.mem_used_mb == 20642 and s.cpu_load_pct == pytest.approx(191 / 12)
