"""Absent means absent: /metrics (strict OpenMetrics parsing), `monitor`, the live view and `report`, with and without sensors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest as text_exposition
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_exposition
from prometheus_client.openmetrics.parser import text_string_to_metric_families as strict_parse
from prometheus_client.parser import text_string_to_metric_families as text_parse

from edgekit.power.jsonl import JsonlLogger, read_log
from edgekit.power.latency import LatencyTracker
from edgekit.power.report import render_report, summarise, summary_rows
from edgekit.power.sensors.discover import absent_names, local_sensors
from edgekit.power.watchdog import Watchdog
from edgekit.runtime.fused_decode import DecodePath

FIX = Path(__file__).parent / "fixtures"
OC_TREE = FIX / "sysfs/orin-nano-super-oc"
POWER_FAMILIES = {"edgekit_power_rail_milliwatts", "edgekit_power_total_milliwatts", "edgekit_power_rails_sum_milliwatts",
                  "edgekit_temperature_celsius", "edgekit_gpu_load_percent", "edgekit_gpu_clock_megahertz",
                  "edgekit_gpu_clock_max_megahertz", "edgekit_overcurrent_events"}


def _watchdog(tree: Path, tracker: LatencyTracker | None = None) -> Watchdog:
    found, notes = local_sensors(tree)
    wd = Watchdog(tracker or LatencyTracker(), sensors=found, absent_sensors=absent_names(notes), log_interval_s=0.0)
    for v in (5.0, 6.0, 7.0):
        wd.tracker.record("token", v)
    wd.tick(now_mono=1.0, now_wall=1000.0, read_all=True)
    return wd


def _strict(registry) -> dict:
    """Parse the OpenMetrics exposition with the strict parser (it raises on any format violation)."""
    fams = {f.name: f for f in strict_parse(openmetrics_exposition(registry).decode())}
    text = text_exposition(registry).decode()  # the 0.0.4 text the server serves: each family once
    names = [f.name for f in text_parse(text)]
    assert len(names) == len(set(names)), names
    return fams


@pytest.mark.parametrize("tree", ["with sensors", "without sensors"])
def test_metrics_parse_strictly_with_and_without_sensors_alongside_the_server_metrics(tree, tmp_path):
    from edgekit.runtime.server import _Metrics

    # as serve wires them: the server's families and the watchdog's share the engine's latency tracker registry
    engine = SimpleNamespace(tracker=LatencyTracker(), queue_depth=lambda: 0, active_rows=lambda: 0, swap_pauses_s=[],
                             decode_path=DecodePath("per-operator", "no GPU"), graphed=False)
    wd = _watchdog(OC_TREE if tree == "with sensors" else tmp_path, engine.tracker)
    assert wd.registry is _Metrics(engine).registry
    fams = _strict(wd.registry)
    avail = {s.labels["sensor"]: s.value for s in fams["edgekit_sensor_available"].samples}
    if tree == "with sensors":
        assert avail == {"ina3221": 1.0, "thermal": 1.0, "gpu_load": 1.0, "soctherm_oc": 1.0, "rapl": 0.0}
        assert POWER_FAMILIES - {"edgekit_power_rails_sum_milliwatts"} <= set(fams)
        assert fams["edgekit_power_total_milliwatts"].samples[0].value == pytest.approx(5104 * 1120 / 1000)
        oc = {s.labels["channel"]: s.value for s in fams["edgekit_overcurrent_events"].samples if s.name.endswith("_total")}
        assert oc == {"oc1": 0.0, "oc2": 0.0, "oc3": 37.0}
    else:
        assert avail == {"ina3221": 0.0, "thermal": 0.0, "gpu_load": 0.0, "soctherm_oc": 0.0, "rapl": 0.0}
        assert not POWER_FAMILIES & set(fams)  # nothing exported for what was not read: no 0 W, no 0 % load
    assert "edgekit_token_latency_seconds" in fams and "edgekit_requests" in fams  # latency (tracker) and the server's own


def test_agx_without_input_rail_exports_a_labelled_sum_and_no_total():
    fams = _strict(_watchdog(FIX / "sysfs/agx-orin-64gb").registry)
    assert "edgekit_power_total_milliwatts" not in fams
    (s,) = fams["edgekit_power_rails_sum_milliwatts"].samples
    assert s.labels["rails"] == "sum of VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0 + VDDQ_VDD2_1V8AO" and s.value == pytest.approx(23520.0)


def _monitor(*args: str) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "edgekit.cli", "monitor", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def test_monitor_gives_six_distinct_samples_spaced_by_the_interval():
    recs = _monitor("--sysfs-root", str(OC_TREE), "--samples", "6", "--interval-ms", "200", "--json")
    ts = [r["t_s"] for r in recs if r["type"] == "sample"]
    assert len(ts) == 6 and len(set(ts)) == 6
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    # paced on a fixed 200 ms grid: each gap is one interval (scheduling slack on a shared machine aside)
    assert all(0.1 < g < 0.35 for g in gaps), gaps
    assert 0.9 < ts[-1] - ts[0] < 1.25, gaps


def test_no_sensors_is_unavailable_everywhere_and_never_zero_power(tmp_path):
    empty = tmp_path / "sys"
    empty.mkdir()
    log = tmp_path / "w.jsonl"
    recs = _monitor("--sysfs-root", str(empty), "--samples", "3", "--interval-ms", "50", "--json", "--log", str(log))
    assert len(recs) == 3
    for r in recs:
        assert r["available"] is False and r["total_mw"] is None and r["rails_mw"] == {} and r["gpu_load_pct"] is None
        assert "ina3221" in r["reason"] and "thermal" in r["reason"]
    # the live view
    from rich.console import Console

    from edgekit.power.monitor_view import render

    con = Console(record=True, width=120)
    con.print(render({"title": "t", "budget_ms": 5.0, "rails_mw": {}, "total_mw": None, "temps_c": {}, "gpu_load_pct": None}))
    text = con.export_text()
    assert "no power sensor" in text and "no temperature sensor" in text and "—" in text
    assert not re.search(r"\b0\.0+\b", text)  # no zero shown for something not measured
    # the report
    r = render_report(log, tmp_path / "rep")
    assert r.summary["power"] == "no power sensor" and "power_mean_w" not in r.summary and "energy_j_from_samples" not in r.summary
    assert r.images == []
    page = r.html.read_text()
    assert "no power sensor" in page and "0.0 W" not in page and "power_mean_w" not in page


def test_energy_is_never_integrated_across_missing_readings(tmp_path):
    log = tmp_path / "gap.jsonl"
    with JsonlLogger(log) as lg:
        lg.meta(source="test")
        for t, w in [(0, 5.0), (1, 5.0), (2, None), (3, 9.0), (4, 9.0)]:
            lg.write({"type": "sample", "t_s": 1000.0 + t, "rails_mw": {} if w is None else {"VDD_IN": w * 1000},
                      "total_mw": None if w is None else w * 1000, "total_source": None if w is None else "VDD_IN"})
    s = summarise(read_log(log))
    # 0-1 s at 5 W and 3-4 s at 9 W: 14 J over 2 s; the 1-3 s stretch around the missing reading is not guessed
    assert s["energy_j_from_samples"] == pytest.approx(14.0) and s["energy_covers_s"] == pytest.approx(2.0)
    assert s["power_samples"] == 4 and s["power_source"] == "VDD_IN"


def test_summary_rows_have_units_and_rounded_numbers(tmp_path):
    log = tmp_path / "r.jsonl"
    with JsonlLogger(log) as lg:
        lg.meta(source="test", power_mode={"name": "25W", "id": 1})
        for i in range(4):
            lg.write({"type": "sample", "t_s": 1000.0 + i / 3, "rails_mw": {"VDD_IN": 86666.66666666667}, "total_mw": 86666.66666666667,
                      "total_source": "VDD_IN"})
        lg.write({"type": "latency", "t_s": 1011.5, "metrics": {"token": {"n": 40, "p50_ms": 6.123456, "p95_ms": 9.5,
                                                                          "p99_ms": 12.987654,
                                                                          "jitter_ms": 6.864198, "std_ms": None}}})
    rows = dict(summary_rows(summarise(read_log(log))))
    assert rows["duration"] == "11.5 s" and rows["power mode"] == "25W (nvpmodel 1)"
    assert rows["power"].startswith("mean 86.67 W, peak 86.67 W (VDD_IN; 4 of 4 samples)")
    assert rows["token latency, last window"] == "n=40, p50 6.12 ms, p99 12.99 ms, jitter 6.86 ms, std —"
    assert not any(re.search(r"\d\.\d{4,}", v) for v in rows.values()), rows
