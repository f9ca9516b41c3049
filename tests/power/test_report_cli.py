"""`edgekit report` on a simulated run, `edgekit monitor` in its offline modes, and the /metrics attachment."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgekit.power.jsonl import read_log
from edgekit.power.latency import LatencyTracker
from edgekit.power.report import render_report
from edgekit.power.scrape import AttachedSource, histogram_quantile

sys.path.insert(0, str(Path(__file__).parent))
from simulate import simulate_run  # noqa: E402

FIX = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def run_log(tmp_path_factory):
    return simulate_run(tmp_path_factory.mktemp("run"))


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_simulated_run_logs_the_expected_events(run_log):
    c = read_log(run_log)
    kinds = [(e["kind"], e["evidence"]["rule"]) for e in c.events]
    # two injected 38 ms tokens -> two spike events; the 9-13 s load step (11.2 W vs 6 ± 3 W) -> one band event
    assert kinds.count(("jitter", "spike")) == 2
    assert kinds.count(("power_band", "band")) == 1
    spikes = [e for e in c.events if e["kind"] == "jitter"]
    assert [round(e["t_s"] - 1_760_000_000.0, 2) for e in spikes] == [6.0, 14.0]  # detected on the tick of the spike


def test_report_writes_labelled_pngs_and_html(run_log, tmp_path):
    r = render_report(run_log, tmp_path / "out")
    assert [p.name for p in r.images] == ["latency.png", "power.png", "temperature.png"]
    for p in r.images:
        w, h = _png_size(p)
        assert w >= 800 and h >= 300
    page = r.html.read_text()
    for img in ("latency.png", "power.png", "temperature.png"):
        assert f'src="{img}"' in page
    assert page.count("<td>jitter</td>") == 2 and "<td>power_band</td>" in page
    assert r.summary["power_peak_w"] == pytest.approx(5080 * 2200 / 1e6, rel=1e-3)
    assert 4.0 < r.summary["power_mean_w"] < 6.5
    assert not list((tmp_path / "out").glob(".*.tmp"))  # atomic writes leave no temp files


def test_report_cli_and_its_refusals(run_log, tmp_path):
    from edgekit.cli import _register_commands, app

    _register_commands()
    runner = CliRunner()
    res = runner.invoke(app, ["report", str(run_log), "-o", str(tmp_path / "r"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["summary"]["events_by_kind"] == {"jitter": 2, "power_band": 1}
    # a tegrastats log is not a watchdog log: say how to convert it
    proc = subprocess.run([sys.executable, "-m", "edgekit.cli", "report", str(FIX / "tegrastats/orin-nx-16gb-jp50.log"), "-o", str(tmp_path / "x")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--tegrastats-log" in proc.stderr and "Traceback" not in proc.stderr
    # a folder (a serve store, whose log is inside) is named as a folder, not as a file that does not exist
    res = runner.invoke(app, ["report", str(tmp_path), "-o", str(tmp_path / "y")])
    assert "is a directory, not a log file" in str(res.exception)  # an EdgekitError: exit 2 through edgekit.cli



def test_a_log_without_records_says_what_it_holds(tmp_path):
    """An empty log was refused as '(0 lines were not JSONL records)', as if it held broken lines, and so was a log
    whose monitor was stopped before its first sample (it holds its meta record alone)."""
    from edgekit.errors import EdgekitError
    from edgekit.power.jsonl import JsonlLogger

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    only_meta = tmp_path / "meta.jsonl"
    log = JsonlLogger(only_meta)
    log.meta(source="tegrastats")
    log.close()
    torn = tmp_path / "torn.jsonl"
    torn.write_text("not json\n{\n")
    for path, held in ((empty, "(it is empty)"), (only_meta, "(it holds only its meta record: the monitor stopped "
                                                              "before its first sample)"),
                       (torn, "(2 lines were not JSONL records)")):
        with pytest.raises(EdgekitError) as refused:
            render_report(path, tmp_path / "out")
        assert refused.value.message == f"{path}: no watchdog records found {held}", refused.value.message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("bad", [
    '{"type": "sample", "t_s": 1760000005.0, "rails_mw": 5}',  # was TypeError: 'int' object is not iterable
    '{"type": "sample", "t_s": "soon", "total_mw": 4000}',
    '{"type": "sample", "t_s": 1760000005.0, "total_mw": "4 W"}',
    '{"type": "sample", "t_s": 1760000005.0, "temps_c": {"gpu": "hot"}}',
    '{"type": "latency", "t_s": 1760000005.0, "metrics": {"token": {"p50_ms": "fast"}}}',
    '{"type": "latency", "t_s": 1760000005.0, "metrics": [1, 2]}',
    '{"type": "event", "t_s": 1760000005.0, "kind": "jitter", "evidence": {"value_ms": "big"}}',
    '{"type": "event", "kind": "jitter"}',
    '{"type": "meta", "policy": [1]}',
    # null where the report computes (a writer's NaN is null on disk since the logs are strict JSON), and shapes
    # the first check let through
    '{"type": "latency", "t_s": 1760000005.0, "metrics": {"token": {"n": 3, "p50_ms": 1.0, "p95_ms": 2.0, '
    '"p99_ms": 3.0, "jitter_ms": null}}}',
    '{"type": "latency", "t_s": 1760000005.0, "metrics": {"token": {"n": 3, "p50_ms": 1.0, "p99_ms": 3.0, '
    '"jitter_ms": 2.0}}}',
    '{"type": "latency", "t_s": 1760000005.0, "metrics": {"token": null}}',
    '{"type": "latency", "t_s": 1760000005.0, "measured_on": 5, "metrics": {}}',
    '{"type": "event", "t_s": 1760000005.0, "kind": "jitter", "evidence": {"value_ms": null}}',
    '{"type": "event", "t_s": 1760000005.0, "kind": "power_band", "evidence": {"total_w": null}}',
    '{"type": "event", "t_s": 1760000005.0, "kind": "jitter", "actions": "x"}',
    '{"type": "sample", "t_s": 1760000005.0, "rails_mw": {"VDD_GPU_SOC": null}}',
    # another writer's NaN / Infinity tokens (Python's json reads them as floats): "duration: nan s", "mean nan W"
    '{"type": "sample", "t_s": NaN}',
    '{"type": "sample", "t_s": 1760000005.0, "total_mw": Infinity}',
    '{"type": "sample", "t_s": 1760000005.0, "rails_mw": {"VDD_GPU_SOC": NaN}}',
    '{"type": "latency", "t_s": 1760000005.0, "metrics": {"token": {"n": 3, "p50_ms": 1.0, "p95_ms": 2.0, '
    '"p99_ms": -Infinity, "jitter_ms": 2.0}}}',
])
def test_a_json_line_with_wrong_field_types_is_skipped_not_a_traceback(run_log, tmp_path, bad):
    """A corrupt line that is still JSON (hand-edited, another tool's) crashed `edgekit report` with a traceback;
    it is now skipped and counted, as a torn line is, and the rest of the log is reported."""
    log = tmp_path / "log.jsonl"
    lines = run_log.read_text().splitlines()
    log.write_text("\n".join([bad, *lines]) + "\n")
    r = render_report(log, tmp_path / "out")
    assert r.summary["skipped_lines"] == 1 and [p.name for p in r.images] == ["latency.png", "power.png", "temperature.png"]
    proc = subprocess.run([sys.executable, "-m", "edgekit.cli", "report", str(log), "-o", str(tmp_path / "cli")],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr

def _monitor(*args: str) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "edgekit.cli", "monitor", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def test_monitor_replays_tegrastats_as_json_lines_with_events(tmp_path):
    log = tmp_path / "replay.jsonl"
    recs = _monitor("--tegrastats-log", str(FIX / "tegrastats/orin-nano-8gb-load-step.log"), "--json", "--power-target-w", "6", "--log", str(log))
    samples = [r for r in recs if r["type"] == "sample"]
    events = [r for r in recs if r["type"] == "event"]
    assert len(samples) == 24
    assert samples[0]["rails_mw"] == {"VDD_IN": 5710.0, "VDD_CPU_GPU_CV": 1172.0, "VDD_SOC": 1528.0}
    assert samples[0]["total_mw"] == 5710.0 and samples[0]["gpu_load_pct"] == 3.0 and samples[0]["temps_c"]["tj"] == 51.4
    assert [e["kind"] for e in events] == ["power_band"] and events[0]["time"] == "2025-05-02T14:00:11.000Z"
    assert events[0]["actions"][0]["status"] == "not_registered"  # the monitor never acts
    c = read_log(log)
    assert len(c.samples) == 24 and len(c.events) == 1


def test_monitor_reads_a_recorded_sysfs_tree(tmp_path):
    (s,) = _monitor("--sysfs-root", str(FIX / "sysfs/agx-orin-64gb"), "--json")
    assert s["rails_mw"] == {"VDD_GPU_SOC": 3150.0, "VDD_CPU_CV": 14310.0, "VIN_SYS_5V0": 4970.0, "VDDQ_VDD2_1V8AO": 1090.0}
    assert s["total_mw"] is None and s["rails_sum_mw"] == 23520.0  # AGX Orin measures no input rail
    assert s["rails_sum_of"] == ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"]
    assert s["gpu_load_pct"] == 14.0 and s["temps_c"]["tj"] == 77.281
    two = _monitor("--sysfs-root", str(FIX / "sysfs/orin-nx-partial"), "--json", "--samples", "2", "--interval-ms", "20")
    assert len(two) == 2 and two[0]["unreadable"] == ["VDD_IN", "VDD_SOC", "gpu"]


def test_monitor_refuses_two_sources_and_bad_overrides(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "edgekit.cli", "monitor", "--sysfs-root", ".", "--tegrastats-log", "x"], capture_output=True, text=True)
    assert proc.returncode == 2 and "choose one source" in proc.stderr
    bad = tmp_path / "p.yaml"
    bad.write_text("jitter_budget_ms: -3\n")
    proc = subprocess.run([sys.executable, "-m", "edgekit.cli", "monitor", "--sysfs-root", str(FIX / "sysfs/orin-nx-16gb"), "--json", "--policy", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "jitter_budget_ms" in proc.stderr and "-3" in proc.stderr



@pytest.mark.parametrize("flag", ["--policy", "--target"])
def test_monitor_refuses_a_policy_or_target_file_that_is_not_utf8_in_one_line(tmp_path, flag):
    """A --policy (or --target YAML) file in another encoding, or binary, ended in a UnicodeDecodeError traceback."""
    bad = tmp_path / "p.yaml"
    bad.write_bytes(b"jitter_budget_ms: 3 \xb5s\n\xff\xfe")
    args = ["monitor", "--sysfs-root", str(FIX / "sysfs/orin-nx-16gb"), "--samples", "1", flag, str(bad)]
    proc = subprocess.run([sys.executable, "-m", "edgekit.cli", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{bad}: not UTF-8 text (byte 20)" in proc.stderr



@pytest.mark.parametrize("interval, said", [("inf", "got 'inf'; expected a finite number"), ("1e300", "3600000")])
def test_monitor_refuses_an_interval_it_cannot_sleep(interval, said):
    """--interval-ms inf or 1e300 was taken, then an OverflowError traceback (int(inf) for the tegrastats period, or
    time.sleep past time_t after the first sample). Refused now as a bad value: inf as no finite number (as every
    number option refuses it), 1e300 naming the limit."""
    args = ["monitor", "--sysfs-root", str(FIX / "sysfs/orin-nx-16gb"), "--samples", "2", "--interval-ms", interval]
    proc = subprocess.run([sys.executable, "-m", "edgekit.cli", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("content, said", [(b"", "it is empty"),
                                           (b'{"type": "meta"}\n{"type": "sample"}\n', "none of its 2 line(s)"),
                                           (None, "is a directory")])
def test_monitor_refuses_a_tegrastats_log_without_one_sample(tmp_path, content, said):
    """An empty file, a watchdog JSONL or a binary passed as --tegrastats-log printed a table of zero samples, exit 0
    (--json: nothing at all); a directory was 'no such file'. Refused now, exit 2, one JSON document with --json."""
    log = tmp_path / "tegrastats.log"
    log.mkdir() if content is None else log.write_bytes(content)
    proc = subprocess.run([sys.executable, "-m", "edgekit.cli", "monitor", "--tegrastats-log", str(log), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and said in proc.stderr and "tegrastats --interval" in proc.stderr, proc.stderr
    (doc,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert doc["ok"] is False and said in doc["error"]["message"]


@pytest.mark.parametrize("args, said", [
    (["--tegrastats-log", str(FIX / "tegrastats/orin-nano-8gb-load-step.log"), "--duration", "2"],
     "--duration does not apply to --tegrastats-log: a replay reads the whole log"),
    (["--tegrastats-log", str(FIX / "tegrastats/orin-nano-8gb-load-step.log"), "--sensors", "thermal"],
     "--sensors does not apply to --tegrastats-log"),
    (["--url", "http://127.0.0.1:9/metrics", "--sensors", "ina3221", "--samples", "1"],
     "--sensors does not apply to --url/--attach"),
])
def test_monitor_refuses_a_flag_its_source_would_ignore(args, said):
    """--duration 2 on a replay printed all 24 samples of a 24 s log, and --sensors thermal on a replay or an attached
    server was dropped (the rails were still there), exit 0 both: the output read as if the flag had been applied."""
    proc = subprocess.run([sys.executable, "-m", "edgekit.cli", "monitor", *args, "--json"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    (doc,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert doc["ok"] is False and said in doc["error"]["message"] and doc["error"]["hint"]
    assert len(_monitor("--tegrastats-log", str(FIX / "tegrastats/orin-nano-8gb-load-step.log"), "--json", "--samples", "2")) == 2


def test_histogram_quantile_interpolates_inside_a_bucket():
    buckets = [(0.004, 0.0), (0.005, 50.0), (0.006, 90.0), (0.010, 100.0), (float("inf"), 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.005)
    assert histogram_quantile(0.7, buckets) == pytest.approx(0.0055)
    assert histogram_quantile(0.95, buckets) == pytest.approx(0.008)
    assert histogram_quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None


def test_attached_mode_reads_a_real_metrics_endpoint():
    from prometheus_client import start_http_server

    from edgekit.power.watchdog import Watchdog

    tracker = LatencyTracker()
    wd = Watchdog(tracker)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=wd.registry)
    try:
        src = AttachedSource(f"http://127.0.0.1:{server.server_port}/metrics")
        for _ in range(50):
            tracker.record("token", 4.5)
        first = src.poll()
        for _ in range(98):
            tracker.record("token", 8.5)
        for _ in range(2):
            tracker.record("token", 20.5)
        second = src.poll()
    finally:
        server.shutdown()
    assert first["latency"]["token"]["n"] == 50 and 4.0 <= first["latency"]["token"]["p50_ms"] <= 5.0
    tok = second["latency"]["token"]  # only the 100 observations since the first poll
    assert tok["n"] == 100 and 8.0 <= tok["p50_ms"] <= 9.0 and tok["p99_ms"] >= 20.0
    assert tok["jitter_ms"] > 5.0


def test_attached_mode_refuses_other_schemes():
    from edgekit.errors import SensorError

    with pytest.raises(SensorError, match="not an http"):
        AttachedSource("file:///etc/passwd")


def test_monitor_attached_to_a_server_prints_interval_percentiles_and_jitter_events():
    from prometheus_client import start_http_server

    from edgekit.cli import _register_commands, app
    from edgekit.power.sample import PowerSample
    from edgekit.power.watchdog import Watchdog

    _register_commands()
    tracker = LatencyTracker()
    wd = Watchdog(tracker)
    wd.observe_sample(PowerSample(t_s=0.0, source="x", rails_mw={"VDD_IN": 7000.0}, total_mw=7000.0, temps_c={"tj": 55.0}))
    for v in [6.5] * 95 + [30.5] * 5:  # p99 - p50 = 24 ms: over the 5 ms budget
        tracker.record("token", v)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=wd.registry)
    try:
        res = CliRunner().invoke(app, ["monitor", "--url", f"http://127.0.0.1:{server.server_port}/metrics", "--json", "--samples", "1"])
    finally:
        server.shutdown()
    assert res.exit_code == 0, res.output
    recs = [json.loads(line) for line in res.stdout.splitlines()]
    scrape = next(r for r in recs if r["type"] == "scrape")
    assert scrape["rails_mw"] == {"VDD_IN": 7000.0} and scrape["total_mw"] == 7000.0 and scrape["temps_c"] == {"tj": 55.0}
    assert scrape["latency"]["token"]["n"] == 100 and 6.0 <= scrape["latency"]["token"]["p50_ms"] <= 7.0
    (event,) = [r for r in recs if r["type"] == "event"]
    assert event["kind"] == "jitter" and event["evidence"]["budget_ms"] == 5.0


def test_live_view_shows_rails_in_watts_latency_and_events():
    from rich.console import Console

    from edgekit.power.monitor_view import render

    con = Console(record=True, width=120)
    con.print(render({
        "title": "t", "budget_ms": 5.0, "rails_mw": {"VDD_IN": 5716.48}, "total_mw": 5716.48, "total_source": "VDD_IN",
        "temps_c": {"tj": 51.4}, "latency": {"token": {"n": 40, "p50_ms": 6.0, "p95_ms": 7.0, "p99_ms": 12.5, "jitter_ms": 6.5, "std_ms": 1.2}},
        "events": [{"time": "2025-05-02T14:00:11Z", "kind": "jitter", "severity": "warning", "message": "spike", "actions": []}],
    }))
    text = con.export_text()
    for needle in ("VDD_IN", "5.716", "total (VDD_IN)", "51.4", "12.50", "6.50", "jitter budget 5 ms", "spike", "°C"):
        assert needle in text, needle


def test_attached_latency_is_a_rolling_window_not_the_last_interval():
    from prometheus_client import start_http_server

    from edgekit.power.watchdog import Watchdog

    tracker = LatencyTracker()
    wd = Watchdog(tracker)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=wd.registry)
    now = [0.0]
    try:
        src = AttachedSource(f"http://127.0.0.1:{server.server_port}/metrics", window_s=10.0, clock=lambda: now[0])
        for _ in range(50):
            tracker.record("token", 4.5)
        assert src.poll()["latency"]["token"]["n"] == 50  # first poll: everything so far
        now[0] = 5.0
        for _ in range(100):
            tracker.record("token", 8.5)
        assert src.poll()["latency"]["token"]["n"] == 100
        now[0] = 8.0  # nothing new in this interval: the window still holds the 100 (no "n=0" while tokens flow)
        mid = src.poll()
        assert mid["latency"]["token"]["n"] == 100 and mid["window_s"] == 8.0
        now[0] = 16.0  # the t=0 and t=5 scrapes have left the 10 s window
        for _ in range(10):
            tracker.record("token", 6.5)
        late = src.poll()
    finally:
        server.shutdown()
    assert late["latency"]["token"]["n"] == 10 and late["window_s"] == 8.0


def test_attached_monitor_lists_server_events_once_in_the_event_format():
    from prometheus_client import start_http_server

    from edgekit.cli import _register_commands, app
    from edgekit.power.events import Event
    from edgekit.power.watchdog import Watchdog

    _register_commands()
    tracker = LatencyTracker()
    wd = Watchdog(tracker)
    for _ in range(6):
        wd.metrics.count_event(Event(t_s=0.0, kind="jitter", severity="warning", message="spike"))
    for v in [6.5] * 95 + [30.5] * 5:
        tracker.record("token", v)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=wd.registry)
    try:
        res = CliRunner().invoke(app, ["monitor", "--url", f"http://127.0.0.1:{server.server_port}/metrics", "--json",
                                       "--samples", "3", "--interval-ms", "20"])
    finally:
        server.shutdown()
    assert res.exit_code == 0, res.output
    recs = [json.loads(line) for line in res.stdout.splitlines()]
    events = [r for r in recs if r["type"] == "event"]
    # the server's six jitter warnings once (not again on later polls), and the window's own breach once (cooldown)
    server_ev = [e for e in events if e["evidence"]["rule"] == "server counter"]
    assert len(server_ev) == 1 and server_ev[0]["evidence"]["events"] == 6 and server_ev[0]["kind"] == "jitter"
    assert len([e for e in events if e["evidence"]["rule"].startswith("p99-p50")]) == 1
    for e in events:  # one format: the watchdog's own event records
        assert set(e) >= {"t_s", "time", "kind", "severity", "message", "evidence", "actions"}
    scrape = next(r for r in recs if r["type"] == "scrape")
    assert scrape["total_mw"] is None and scrape["rails_mw"] == {}  # this server has no sensors: nothing, not 0


def test_report_draws_token_ttft_and_request_latency_and_jitter_against_the_budget_with_events(tmp_path):
    """It drew one metric only (token when present); TTFT and request latency were in the log, not in the report."""
    from edgekit.power.report import _t0, latency_figure

    c = read_log(simulate_run(tmp_path, tokens_per_request=50))
    fig = latency_figure(c, _t0(c))
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["per-token latency over a rolling window", "time to first token over a rolling window",
                      "request latency over a rolling window", "jitter against the budget"]
    for ax in fig.axes[:3]:
        assert [ln.get_label() for ln in ax.get_lines() if ln.get_linestyle() != ":"] == ["p50", "p95", "p99"]
    jitter = fig.axes[3]
    budget = [ln for ln in jitter.get_lines() if ln.get_label() == "budget 5 ms"]
    assert len(budget) == 1 and list(budget[0].get_ydata()) == [5.0, 5.0]
    assert "token jitter p99 - p50" in [ln.get_label() for ln in jitter.get_lines()]
    for ax in fig.axes:  # every event on every panel, as a dotted vertical line at its time
        assert len([ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]) == len(c.events) == 3
    r = render_report(simulate_run(tmp_path / "again", tokens_per_request=50), tmp_path / "out")
    assert set(r.summary["latency_last_window"]) == {"token", "ttft", "request"}


def test_an_idle_tail_does_not_hide_the_last_busy_window_in_the_summary(run_log, tmp_path):
    from edgekit.power.report import summarise

    c = read_log(run_log)
    c.latency.append({"type": "latency", "t_s": c.latency[-1]["t_s"] + 11.0, "metrics": {}})  # the window emptied
    assert summarise(c)["latency_last_window"]["token"]["n"] > 0


def _drawn(line) -> bool:
    """Whether a plotted series shows every reading it holds: a line needs two neighbouring points, a lone reading a
    marker."""
    y = [float(v) for v in line.get_ydata()]
    has = [v == v for v in y]  # not NaN
    alone = [i for i, ok in enumerate(has) if ok and not any(0 <= j < len(y) and has[j] for j in (i - 1, i + 1))]
    every = line.get_markevery()
    return not alone or (line.get_marker() not in ("None", "", None) and set(alone) <= set(every or []))


def test_a_lone_reading_is_drawn_not_an_empty_figure(tmp_path, monkeypatch):
    """A log of one sample (monitor --samples 1 --log), or a zone read once between two gaps, got power.png and
    temperature.png with their legends and nothing in the axes: a line needs two points."""
    from edgekit.power import report

    figures = {}
    monkeypatch.setattr(report, "_save", lambda fig, path: figures.__setitem__(path.name, fig))
    t = 1_760_000_000.0
    one = {"type": "sample", "t_s": t, "rails_mw": {"VDD_IN": 4370.0, "VDD_SOC": 1384.0}, "total_mw": 4370.0,
           "total_source": "VDD_IN", "temps_c": {"cpu": 46.1, "gpu": 46.4}, "gpu_load_pct": 0.0}
    log = tmp_path / "one.jsonl"
    log.write_text(json.dumps(one) + "\n")
    r = render_report(log, tmp_path / "out")
    assert [p.name for p in r.images] == ["power.png", "temperature.png"] == sorted(figures)
    for name, fig in figures.items():
        lines = [ln for ax in fig.axes for ln in ax.get_lines() if len(ln.get_xdata()) == 1]
        assert lines and all(map(_drawn, lines)), name
        assert all(ax.get_xlim()[0] < 0.0 < ax.get_xlim()[1] for ax in fig.axes), name  # not on the axis' edge
    # three samples, the gpu zone read in the middle one only
    gap = [dict(one, t_s=t + i, temps_c={"cpu": 46.1, **({"gpu": 46.4} if i == 1 else {})}) for i in range(3)]
    log.write_text("".join(json.dumps(s) + "\n" for s in gap))
    figures.clear()
    render_report(log, tmp_path / "out")
    (gpu,) = [ln for ln in figures["temperature.png"].axes[0].get_lines() if ln.get_label() == "gpu"]
    assert _drawn(gpu)


def test_a_mean_or_peak_of_power_is_taken_of_one_quantity_not_of_sums_missing_a_rail(tmp_path):
    """An AGX Orin log (no input rail: power is the sum of four rails, 27.2 W) whose last two lines were cut off in a
    rail (21 W sums of two): the replay table said 'power mean / peak (sum of the four rails) 26.167 / 27.200 W' and
    report 'mean 26.17 W' over a mix of the two quantities, under the four rails' name, and integrated the energy
    across both."""
    line = ("11-21-2025 08:50:{:02d} RAM 14001/62780MB GR3D_FREQ 40%@[1300,1300] GPU@70C VDD_GPU_SOC 9000mW/8000mW "
            "VDD_CPU_CV 12000mW/11000mW VIN_SYS_5V0 5000mW/5000mW VDDQ_VDD2_1V8AO 1200mW/1100mW")
    lines = [line.format(i) for i in range(12)]
    lines[10:] = [x[:x.index("VIN_SYS_5V0") + 14] for x in lines[10:]]  # "... VIN_SYS_5V0 50"
    tegrastats, log = tmp_path / "agx.log", tmp_path / "agx.jsonl"
    tegrastats.write_text("\n".join(lines) + "\n")
    proc = subprocess.run([sys.executable, "-m", "edgekit.cli", "monitor", "--tegrastats-log", str(tegrastats),
                           "--log", str(log)], capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert "| 27.200 / 27.200 W (10 of 12 samples) |" in proc.stdout.replace("│", "|")
    s = render_report(log, tmp_path / "out").summary
    assert (s["power_mean_w"], s["power_peak_w"], s["power_samples"]) == (27.2, 27.2, 10)
    assert s["power_source"] == "sum of VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0 + VDDQ_VDD2_1V8AO"
    assert s["energy_covers_s"] == 9.0 and s["energy_j_from_samples"] == pytest.approx(27.2 * 9.0)
