"""INA3221 rails, thermal zones and GPU load read from recorded sysfs trees of three Orin boards."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edgekit.power.sensors.discover import local_sensors
from edgekit.power.sensors.gpu_load import TegraGpuLoadSensor
from edgekit.power.sensors.hwmon_ina3221 import Ina3221Sensor, find_channels
from edgekit.power.sensors.thermal import ThermalSensor

SYSFS = Path(__file__).parent / "fixtures" / "sysfs"


def test_agx_orin_has_no_input_rail_so_no_total_only_a_labelled_sum_and_nc_is_skipped():
    s = Ina3221Sensor(SYSFS / "agx-orin-64gb").read(0.0)
    assert s.available
    # mV * mA / 1000 per channel, worked out by hand from the fixture files
    assert s.rails_mw == {"VDD_GPU_SOC": 3150.0, "VDD_CPU_CV": 14310.0, "VIN_SYS_5V0": 4970.0, "VDDQ_VDD2_1V8AO": 1090.0}
    # the board measures no input: no "total", a sum that names what it adds (5 V system rail included)
    assert s.total_mw is None and s.total_source is None
    assert s.rails_sum_mw == pytest.approx(3150 + 14310 + 4970 + 1090)
    assert s.rails_sum_of == ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"]
    assert s.budget_power() == (pytest.approx(23520.0), "sum of VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0 + VDDQ_VDD2_1V8AO")
    chips = {c.chip for c in find_channels(SYSFS / "agx-orin-64gb")}
    assert chips == {"1-0040", "1-0041"}  # both hwmon3 and hwmon4 were found by globbing


def test_orin_nx_total_is_vdd_in_not_the_sum():
    s = Ina3221Sensor(SYSFS / "orin-nx-16gb").read(0.0)
    assert s.rails_mw == pytest.approx({"VDD_IN": 5080 * 844 / 1000, "VDD_CPU_GPU_CV": 5072 * 102 / 1000, "VDD_SOC": 5072 * 264 / 1000})
    assert s.total_mw == pytest.approx(4287.52)
    assert s.total_source == "VDD_IN"


def test_orin_nano_chip_found_through_i2c_devices_name():
    s = Ina3221Sensor(SYSFS / "orin-nano-8gb").read(0.0)
    assert set(s.rails_mw) == {"VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"}
    assert s.total_mw == pytest.approx(5104 * 1120 / 1000)
    assert s.total_source == "VDD_IN"


def test_summation_and_unlabelled_shunt_channels_are_not_rails():
    names = [c.rail for c in find_channels(SYSFS / "orin-nx-16gb")]
    assert names == ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]  # in7 "sum of shunt voltages" has no current file


def test_partial_tree_reports_unreadable_rails_and_no_total_when_the_input_rail_is_unreadable(tmp_path):
    # the fixture is a recorded rootfs (DIR/sys/...): the root resolves to DIR/sys
    s = Ina3221Sensor(SYSFS / "orin-nx-partial").read(0.0)
    assert s.available
    assert s.rails_mw == pytest.approx({"VDD_CPU_GPU_CV": 5072 * 102 / 1000})
    assert sorted(s.unreadable) == ["VDD_IN", "VDD_SOC"]
    # VDD_IN exists but failed: a sum of the sub-rails would be passed off as the total
    assert s.total_mw is None and s.rails_sum_mw is None and s.budget_power() == (None, None)
    assert "VDD_IN" in s.reason


def test_missing_tree_is_unavailable_not_an_exception(tmp_path):
    s = Ina3221Sensor(tmp_path / "nothing-here").read(0.0)
    assert not s.available and "no INA3221" in s.reason
    assert not ThermalSensor(tmp_path).read(0.0).available
    assert not TegraGpuLoadSensor(tmp_path).read(0.0).available


def test_rails_that_vanish_while_running_become_unavailable(tmp_path):
    board = tmp_path / "nx"
    shutil.copytree(SYSFS / "orin-nx-16gb", board)
    # On real sysfs an unbound device's open files fail at once (ENODEV); a recorded tree is
    # plain files, whose open handles keep reading the deleted data until they are reopened,
    # so this sensor reopens on every read (the default trusts a handle for 1 s).
    sensor = Ina3221Sensor(board, reopen_s=0.0)
    assert sensor.read(0.0).total_mw == pytest.approx(4287.52)
    shutil.rmtree(board / "bus")  # the driver unbinds
    s = sensor.read(1.0)
    assert not s.available and "no rail could be read" in s.reason


def test_values_are_reread_each_time(tmp_path):
    board = tmp_path / "nano"
    shutil.copytree(SYSFS / "orin-nano-8gb", board)
    sensor = Ina3221Sensor(board)
    first = sensor.read(0.0).total_mw
    (board / "bus/i2c/devices/1-0040/hwmon/hwmon2/curr1_input").write_text("2000\n")
    assert first == pytest.approx(5716.48)
    assert sensor.read(1.0).total_mw == pytest.approx(5104 * 2000 / 1000)


def test_a_directory_where_a_value_file_should_be_is_unreadable_not_fatal(tmp_path):
    board = tmp_path / "agx"
    shutil.copytree(SYSFS / "agx-orin-64gb", board)
    f = board / "bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3/curr2_input"
    f.unlink()
    f.mkdir()  # reading it raises IsADirectoryError
    s = Ina3221Sensor(board).read(0.0)
    assert s.unreadable == ["VDD_CPU_CV"]
    assert s.total_mw is None and s.rails_sum_mw == pytest.approx(3150 + 4970 + 1090)
    assert s.rails_sum_of == ["VDD_GPU_SOC", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"]


@pytest.mark.parametrize(
    "board, expected",
    [
        ("agx-orin-64gb", {"cpu": 71.5, "gpu": 69.125, "soc0": 68.218, "soc1": 66.25, "soc2": 67.5, "tj": 77.281, "tboard_tegra": 56.0, "tdiode_tegra": 58.25}),
        ("orin-nx-16gb", {"tj": 45.312, "cpu": 45.312, "soc2": 43.812, "soc0": 44.375, "soc1": 43.406}),
        ("orin-nano-8gb", {"cpu": 51.093, "gpu": 50.406, "soc0": 49.343, "soc1": 49.781, "soc2": 49.093, "tj": 51.406}),
    ],
)
def test_thermal_zones_by_type_with_powered_off_zones_left_out(board, expected):
    s = ThermalSensor(SYSFS / board).read(0.0)
    assert s.temps_c == pytest.approx(expected)
    assert not any(k.startswith("cv") for k in s.temps_c)  # -256 C: powered off


def test_thermal_empty_file_is_unreadable():
    s = ThermalSensor(SYSFS / "orin-nx-partial").read(0.0)
    assert s.temps_c == {"cpu": 45.312}
    assert s.unreadable == ["gpu"]


@pytest.mark.parametrize("board, load, freq", [("agx-orin-64gb", 14.0, 407.0), ("orin-nx-16gb", 0.0, 306.0), ("orin-nano-8gb", 98.7, 624.75)])
def test_gpu_load_per_mille_and_clock(board, load, freq):
    s = TegraGpuLoadSensor(SYSFS / board).read(0.0)
    assert s.gpu_load_pct == pytest.approx(load)
    assert s.gpu_freq_mhz == pytest.approx(freq)


def test_discovery_on_a_recorded_tree_merges_rails_temps_and_load():
    from edgekit.power.sensors.base import CompositeSensor

    sensors, notes = local_sensors(SYSFS / "orin-nano-8gb")
    assert [s.name for s in sensors] == ["ina3221", "thermal", "gpu_load"]
    assert any(n.startswith("rapl:") for n in notes)
    s = CompositeSensor(sensors).read(0.0)
    assert s.total_mw == pytest.approx(5716.48) and s.gpu_load_pct == pytest.approx(98.7) and s.temps_c["tj"] == pytest.approx(51.406)
