"""A live tegrastats process (a fake one on PATH printing recorded lines) and nvpmodel's power mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgekit.power.sensors.discover import local_sensors
from edgekit.power.sensors.power_mode import parse_nvpmodel_query, read_power_mode
from edgekit.power.sensors.tegrastats_live import TegrastatsSensor

pytestmark = pytest.mark.serial  # it times wall-clock behaviour: scripts/test.sh runs it alone, after the parallel phase

FIX = Path(__file__).parent / "fixtures"
BIN = FIX / "bin"
NANO_LOG = FIX / "tegrastats/orin-nano-8gb-load-step.log"


@pytest.fixture
def fake_tools(monkeypatch):
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("EDGEKIT_FAKE_TEGRASTATS_LOG", str(NANO_LOG))


def _first_available(sensor: TegrastatsSensor, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = sensor.read()
        if s.available:
            return s
        time.sleep(0.02)
    raise AssertionError(f"no tegrastats sample within {timeout_s} s: {s.reason}")


def test_live_tegrastats_lines_become_samples_and_the_process_is_killed_on_close(fake_tools):
    sensor = TegrastatsSensor(interval_ms=50)
    assert sensor.available() and sensor.path == str(BIN / "tegrastats")
    try:
        s = _first_available(sensor)
        assert s.source == "tegrastats"
        assert s.rails_mw in ({"VDD_IN": v, "VDD_CPU_GPU_CV": 1172.0, "VDD_SOC": 1528.0} for v in (5710.0, 5733.0, 5756.0, 5779.0))
        assert s.total_source == "VDD_IN" and s.gpu_load_pct == 3.0 and s.temps_c["tj"] == 51.4
        assert abs(s.t_s - time.time()) < 5.0  # stamped when the line arrived, not with the log's 2025 date
        deadline = time.monotonic() + 10.0
        while sensor.lines < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sensor.lines >= 3 and sensor.skipped == 0  # line by line, as they come
        proc = sensor._proc
    finally:
        sensor.close()
    assert proc.poll() is not None  # terminated, not left behind
    after = sensor.read()
    assert not after.available and "closed" in after.reason and sensor._proc is None  # a closed sensor starts nothing
    sensor.close()  # twice is fine


def test_a_tegrastats_that_exits_is_reported_with_its_status_and_message(fake_tools, monkeypatch):
    monkeypatch.setenv("EDGEKIT_FAKE_TEGRASTATS_LOG", str(FIX / "tegrastats/xavier-nx-jp4.log"))
    monkeypatch.setenv("EDGEKIT_FAKE_TEGRASTATS_EXIT", "3")
    sensor = TegrastatsSensor(interval_ms=20)
    try:
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            s = sensor.read()
            if "exited" in (s.reason or ""):
                break
            time.sleep(0.05)
        assert not s.available and "status 3" in s.reason and "stopping" in s.reason
    finally:
        sensor.close()


def test_no_tegrastats_on_path_is_unavailable_without_spawning(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    sensor = TegrastatsSensor()
    s = sensor.read()
    assert not sensor.available() and not s.available and "no 'tegrastats' executable on PATH" in s.reason
    assert sensor._proc is None


def test_discovery_starts_tegrastats_only_where_no_sysfs_rail_is_readable(fake_tools, tmp_path, monkeypatch):
    import edgekit.power.sensors.sysfs as sysfs

    monkeypatch.setattr(sysfs, "DEFAULT_SYSFS_ROOT", FIX / "sysfs/orin-nx-16gb")  # "this machine" is an Orin NX
    with_rails, _ = local_sensors(only=["ina3221", "tegrastats", "thermal"])
    assert [s.name for s in with_rails] == ["ina3221", "tegrastats", "thermal"]  # named explicitly: used
    default, _ = local_sensors()
    assert "ina3221" in [s.name for s in default] and "tegrastats" not in [s.name for s in default]  # rails readable
    monkeypatch.setattr(sysfs, "DEFAULT_SYSFS_ROOT", tmp_path)  # a board whose rails sysfs does not show
    fallback, notes = local_sensors()
    assert "tegrastats" in [s.name for s in fallback] and any(n.startswith("ina3221:") for n in notes)
    for s in with_rails + default + fallback:
        s.close()


def test_rails_listed_but_unreadable_fall_back_to_tegrastats(fake_tools, tmp_path, monkeypatch):
    import shutil

    board = tmp_path / "nx"
    shutil.copytree(FIX / "sysfs/orin-nx-16gb", board)
    for f in board.glob("bus/i2c/drivers/ina3221/*/hwmon/hwmon*/curr*_input"):
        f.unlink()
        f.mkdir()  # every current read fails (as a root-only file does for a user)
    found, notes = local_sensors(board, only=["ina3221", "tegrastats"])
    try:
        assert [s.name for s in found] == ["tegrastats"]
        assert any(n.startswith("ina3221: no rail could be read") for n in notes), notes
    finally:
        for s in found:
            s.close()


def test_monitor_reads_a_live_tegrastats_as_json(fake_tools):
    proc = subprocess.run([sys.executable, "-m", "edgekit.cli", "monitor", "--sensors", "tegrastats", "--samples", "4",
                           "--interval-ms", "100", "--json"], capture_output=True, text=True, timeout=60, env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr
    recs = [json.loads(line) for line in proc.stdout.splitlines()]
    samples = [r for r in recs if r["type"] == "sample"]
    assert len(samples) == 4
    live = [s for s in samples if s["available"]]
    assert live, samples  # the first may come before the process printed anything
    assert all(s["total_source"] == "VDD_IN" and s["rails_mw"]["VDD_SOC"] == 1528.0 for s in live)
    assert not any(s["available"] is False and s["total_mw"] is not None for s in samples)


def test_power_mode_from_nvpmodel_query(fake_tools, monkeypatch, tmp_path):
    assert read_power_mode() == {"name": "25W", "id": 1}
    assert parse_nvpmodel_query("NVPM WARN: patching\nNV Power Mode: MAXN_SUPER\n2\n") == {"name": "MAXN_SUPER", "id": 2}
    assert parse_nvpmodel_query("nvpmodel: command failed") is None
    monkeypatch.setenv("PATH", str(tmp_path))
    assert read_power_mode() is None
