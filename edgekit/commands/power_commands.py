"""`edgekit monitor` and `edgekit report`: the on-device latency/power watchdog from the command line."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from edgekit.cli import app
from edgekit.cli_common import console

# inf or 1e300 was taken and ended in an OverflowError traceback (int(inf) for the tegrastats period, or time.sleep
# past the platform's time_t after the first sample); an hour between samples is already more than a watchdog uses.
MAX_INTERVAL_MS = 3_600_000.0


def _emit(record: dict) -> None:
    """One JSON object per line on stdout (for --json), strict as print_json's: NaN / inf are null (an empty
    window's jitter statistics are NaN)."""
    from edgekit.strict_json import strict_dumps

    sys.stdout.write(strict_dumps(record, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _load_doc(path: Path) -> dict:
    import yaml

    from edgekit.errors import ConfigError

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))  # YAML is a superset of JSON
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read it as YAML/JSON: {e}") from e
    except UnicodeDecodeError as e:  # a binary file or another encoding: a ValueError, once a traceback here
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); expected a YAML/JSON mapping of policy fields",
                          hint="convert it to UTF-8, or pass the YAML/JSON file meant") from e
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping of policy fields, got {type(doc).__name__}")
    return doc


def _target_profile(target: str) -> dict:
    """A target profile as plain data: a YAML path, or the name of one shipped in edgekit.targets."""
    from importlib import resources

    from edgekit.errors import ConfigError

    p = Path(target)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return _load_doc(p)
    res = resources.files("edgekit.targets") / f"{target}.yaml"
    if not res.is_file():
        names = sorted(x.name[:-5] for x in resources.files("edgekit.targets").iterdir() if x.name.endswith(".yaml"))
        raise ConfigError(f"no target profile named {target!r}", hint=f"choose from {', '.join(names)} or pass a YAML file")
    import yaml

    return yaml.safe_load(res.read_text(encoding="utf-8"))


def _policy(target, policy_file, jitter_budget_ms, power_band_w, power_target_w):
    from edgekit.power.policy import PolicyConfig

    overrides = _load_doc(policy_file) if policy_file else {}
    for k, v in (("jitter_budget_ms", jitter_budget_ms), ("power_band_w", power_band_w), ("power_target_w", power_target_w)):
        if v is not None:
            overrides[k] = v
    return PolicyConfig.from_profile(_target_profile(target) if target else None, overrides)


@app.command()
def monitor(
    tegrastats_log: Optional[Path] = typer.Option(None, "--tegrastats-log", help="Replay a recorded tegrastats log (any JetPack format) instead of reading sensors."),
    sysfs_root: Optional[Path] = typer.Option(None, "--sysfs-root", help="Read a recorded or mounted sysfs tree (the directory that stands for /sys, or one holding sys/)."),
    url: Optional[str] = typer.Option(None, "--url", help="Attach to a server's Prometheus /metrics URL (http only to that URL), e.g. http://127.0.0.1:8000/metrics."),
    attach: bool = typer.Option(False, "--attach", help="Attach to the local server at http://127.0.0.1:8000/metrics."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object per line: samples (time, rails in mW, measured total or labelled sum of rails, GPU load, temperatures, over-current counters; absent readings are null, never 0) and events."),
    log: Optional[Path] = typer.Option(None, "--log", help="Also append every sample and event to this JSONL file (input of `edgekit report`)."),
    duration: Optional[float] = typer.Option(None, "--duration", min=0.0, help="Stop after this many seconds (live sensors, --sysfs-root, --url/--attach; a replay stops with --samples)."),
    samples: Optional[int] = typer.Option(None, "--samples", min=1, help="Stop after this many samples."),
    interval_ms: Optional[float] = typer.Option(
        None, "--interval-ms", min=1.0, max=MAX_INTERVAL_MS,
        help="Sampling interval (default 500 ms, at most an hour); for a tegrastats log without timestamps, the "
             "interval it was recorded at (default 1000 ms)."),
    sensors: Optional[str] = typer.Option(None, "--sensors", help="Comma-separated sensors to use (ina3221, tegrastats, thermal, gpu_load, soctherm_oc, nvml, rapl, system); default: all present, with a live tegrastats only where no INA3221 rail is readable. Not with --tegrastats-log or --url/--attach."),
    target: Optional[str] = typer.Option(None, "--target", help="Take the budgets from this target profile (a name such as orin-nano-8gb, or a YAML file)."),
    policy_file: Optional[Path] = typer.Option(None, "--policy", help="Per-deployment overrides of the watchdog policy (YAML/JSON mapping)."),
    jitter_budget_ms: Optional[float] = typer.Option(None, "--jitter-budget-ms", help="Override the jitter budget (default 5 ms)."),
    power_band_w: Optional[float] = typer.Option(None, "--power-band-w", help="Override the power band half-width (default 3 W)."),
    power_target_w: Optional[float] = typer.Option(None, "--power-target-w", help="Centre of the power band; without it the centre is the median of the first 5 s."),
) -> None:
    """Watch latency percentiles, jitter, power per rail, temperatures and the events the policies raise.

    The monitor never acts: actions are reported as what they would have done
    (the runtime's in-process watchdog runs them). Ends on --duration/--samples,
    at the end of a replayed log, or on Ctrl-C.
    """
    from edgekit.errors import EdgekitError
    from edgekit.output_path import check_output_path

    if log is not None:
        check_output_path(log, "--log", kind="file")
    modes = [m for m, on in (("--tegrastats-log", tegrastats_log), ("--sysfs-root", sysfs_root), ("--url/--attach", url or attach)) if on]
    if len(modes) > 1:
        raise EdgekitError(f"choose one source, got {' and '.join(modes)}", hint="replay a log, read a sysfs tree, or attach to a server")
    _refuse_flags_the_source_ignores(modes[0] if modes else "local", duration=duration, sensors=sensors)
    pol = _policy(target, policy_file, jitter_budget_ms, power_band_w, power_target_w)
    if tegrastats_log is not None:
        _replay(tegrastats_log, pol, json_out, log, samples, interval_ms or 1000.0)
    elif url or attach:
        from edgekit.power.scrape import DEFAULT_URL

        _attached(url or DEFAULT_URL, pol, json_out, log, duration, samples, interval_ms or 500.0)
    else:
        if sysfs_root is not None and not sysfs_root.is_dir():
            raise EdgekitError(f"--sysfs-root {sysfs_root}: not a directory", hint="pass a recorded tree (e.g. tests/power/fixtures/sysfs/orin-nx-16gb) or a mounted /sys")
        if json_out and sysfs_root is not None and duration is None and samples is None:
            samples = 1  # a recorded tree does not change: one reading unless asked for more
        _local(sysfs_root, sensors, pol, json_out, log, duration, samples, interval_ms or 500.0)


# What a source would drop without a word: a replay runs through the log at no wall-clock pace (--duration 2 printed
# all 24 samples of a 24 s log), and a log or a server brings its own sensors (--sensors thermal printed the rails).
_IGNORED_BY = {
    "--tegrastats-log": {
        "--duration": ("a replay reads the whole log, at no wall-clock pace", "use --samples N to stop after N samples"),
        "--sensors": ("the log holds what tegrastats printed", "drop --sensors"),
    },
    "--url/--attach": {"--sensors": ("the server reports the sensors it reads", "drop --sensors")},
}


def _refuse_flags_the_source_ignores(source: str, **given) -> None:
    from edgekit.errors import EdgekitError

    for flag, (why, hint) in _IGNORED_BY.get(source, {}).items():
        if given.get(flag.removeprefix("--")) is not None:
            raise EdgekitError(f"{flag} does not apply to {source}: {why}", hint=hint)


def _replay(path: Path, pol, json_out: bool, log: Optional[Path], limit: Optional[int], interval_ms: float) -> None:
    from rich.table import Table

    from edgekit.errors import EdgekitError
    from edgekit.power.report import board_power
    from edgekit.power.jsonl import JsonlLogger
    from edgekit.power.sensors.tegrastats import parse_lines
    from edgekit.power.watchdog import Watchdog

    record_hint = "record one on the board with `tegrastats --interval 1000 --logfile FILE`"
    if not path.is_file():
        what = "is a directory, expected a tegrastats log file" if path.is_dir() else "no such file"
        raise EdgekitError(f"--tegrastats-log {path}: {what}", hint=record_hint)
    wd = Watchdog(policy=pol, logger=JsonlLogger(log) if log else None, dry_run=True)
    wd.write_meta(source=f"tegrastats:{path}")
    n, skipped, events, readings = 0, [], [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line_no, s in parse_lines(f, interval_ms / 1000.0):
            if s is None:
                skipped.append(line_no)
                continue
            evs = wd.observe_sample(s)
            n += 1
            if s.budget_power()[0] is not None:  # the measured total, else the labelled sum of rails
                readings.append(s.to_dict())
            events += evs
            if json_out:
                _emit({"type": "sample", "line": line_no, **s.to_dict()})
                for e in evs:
                    _emit({"type": "event", **e.to_dict()})
            if limit is not None and n >= limit:
                break
    wd.stop()
    if n == 0:  # the wrong file (a watchdog JSONL, a binary, an empty one): once a table of zero samples, exit 0
        from edgekit.errors import SensorError

        what = f"none of its {len(skipped)} line(s) is a tegrastats line" if skipped else "it is empty"
        raise SensorError(f"--tegrastats-log {path}: no tegrastats sample: {what}", hint=record_hint)
    if json_out:
        if skipped:
            _emit({"type": "skipped", "lines": skipped, "reason": "nothing recognisable in these lines"})
        return
    t = Table(title=f"tegrastats replay: {path}")
    t.add_column("")
    t.add_column("value", justify="right")
    t.add_row("samples", str(n))
    t.add_row("lines skipped", ", ".join(map(str, skipped)) or "none")
    what, powers = board_power(readings)  # one quantity, as the report takes it: a line cut short is a lesser sum
    mws = [mw for mw in powers if mw is not None]
    if mws:
        t.add_row(f"power mean / peak ({what})", f"{sum(mws) / len(mws) / 1000:.3f} / {max(mws) / 1000:.3f} W"
                  + (f" ({len(mws)} of {n} samples)" if len(mws) < n else ""))
    else:
        t.add_row("power", "no power rails in this log")
    if wd.latest is not None:
        for rail, mw in wd.latest.rails_mw.items():
            t.add_row(f"last {rail}", f"{mw / 1000:.3f} W")
    t.add_row("events", str(len(events)))
    console.print(t)
    for e in events:
        console.print(f"[yellow]{e.kind}[/] ({e.severity}): {e.message}")


def _until(duration, samples):
    start = time.monotonic()

    def done(n: int) -> bool:
        return (samples is not None and n >= samples) or (duration is not None and time.monotonic() - start >= duration)

    return done


def _run_paced(step, done, interval_ms: float, state: dict | None = None) -> None:
    """Call ``step(t_monotonic)`` once per interval until ``done(calls)`` or Ctrl-C.

    Steps are due on a fixed grid (start + n x interval), not "interval after the last step
    ended", so the time a step takes does not stretch the spacing; a step that overruns a
    whole interval moves the grid on instead of firing a burst to catch up.
    With ``state`` (what the step fills in for the views of edgekit.power.monitor_view) a live table is kept
    open on a terminal and refreshed after every step; anywhere else each step prints one line per sample and per
    new event, and the notes come once at the end. The caller releases its own resources (watchdog, logger)
    afterwards.
    """
    from rich.live import Live

    from edgekit.power.monitor_view import fit_line, render, render_event_line, render_line

    live = Live(render(state), console=console, refresh_per_second=4) if state is not None and console.is_terminal else None
    lines = state is not None and live is None
    shown_notes: list[str] = []

    def print_lines() -> None:
        nonlocal shown_notes
        texts = [render_line(state, time.strftime("%H:%M:%S")), *map(render_event_line, state.pop("new_events", []))]
        if state.get("notes") != shown_notes:  # sensors absent, a server unreachable: said when it changes
            shown_notes = list(state.get("notes") or [])
            texts = [*map(fit_line, shown_notes), *texts]
        for text in texts:
            console.print(text, markup=False, highlight=False, soft_wrap=True)

    period = interval_ms / 1000.0
    n = 0
    try:
        if live:
            live.start()
        elif lines:
            console.print(fit_line(state["title"]), markup=False, highlight=False, soft_wrap=True)
        due = time.monotonic()
        while not done(n):
            step(due)
            n += 1
            if live:
                live.update(render(state))
            elif lines:
                print_lines()
            if done(n):
                break
            due += period
            now = time.monotonic()
            if now > due:  # overran: keep the spacing, drop the missed slot
                due += period * math.ceil((now - due) / period)
            time.sleep(max(0.0, due - time.monotonic()))
    except KeyboardInterrupt:
        pass
    finally:
        if live:
            live.stop()


def _local(sysfs_root, sensors, pol, json_out, log, duration, samples, interval_ms) -> None:
    from edgekit.power.jsonl import JsonlLogger
    from edgekit.power.sensors.discover import absent_names, local_sensors
    from edgekit.power.sensors.power_mode import read_power_mode
    from edgekit.power.watchdog import Watchdog

    only = [s.strip() for s in sensors.split(",") if s.strip()] if sensors else None
    found, notes = local_sensors(sysfs_root, only, tegrastats_interval_ms=max(10, int(interval_ms)))
    # No thread here: the monitor ticks the watchdog itself, once per interval, reads every sensor on
    # each tick (one fresh sample per line, whatever a sensor's own refresh interval) and logs every tick.
    wd = Watchdog(sensors=found, policy=pol, logger=JsonlLogger(log) if log else None, log_interval_s=0.0, dry_run=True,
                  absent_sensors=absent_names(notes), steady_log_interval_s=0.0)
    # the power mode of this machine; a recorded tree's is unknown (its boards' nvpmodel is not here)
    wd.write_meta(source=str(sysfs_root) if sysfs_root else "local", power_mode=None if sysfs_root else read_power_mode())
    done = _until(duration, samples)
    title = f"edgekit monitor: {', '.join(s.describe() for s in found) or 'no sensors'}" + (f" ({sysfs_root})" if sysfs_root else "")
    state = {"title": title, "budget_ms": pol.jitter_budget_ms, "events": [], "latency": {},
             "notes": [f"absent: {n}" for n in notes] + ["no latency source here: attach to a server with --url to see latency"]}

    def step(t_mono: float) -> None:
        evs = wd.tick(now_mono=t_mono, read_all=True)
        s = wd.latest
        if json_out:
            if s is not None:
                _emit({"type": "sample", **s.to_dict()})
            for e in evs:
                _emit({"type": "event", **e.to_dict()})
        else:
            state["events"] = [e.to_dict() for e in wd.recent_events(8)]
            state["new_events"] = [e.to_dict() for e in evs]
            if s is not None:
                state.update(rails_mw=s.rails_mw, total_mw=s.total_mw, total_source=s.total_source,
                             rails_sum_mw=s.rails_sum_mw, rails_sum_of=s.rails_sum_of,
                             gpu_load_pct=s.gpu_load_pct, cpu_load_pct=s.cpu_load_pct, temps_c=s.temps_c,
                             placeholder_temps_c=s.placeholder_temps_c)

    try:
        _run_paced(step, done, interval_ms, None if json_out else state)
    finally:
        wd.stop()


def _attached(url, pol, json_out, log, duration, samples, interval_ms) -> None:
    from edgekit.errors import SensorError
    from edgekit.power.events import Event
    from edgekit.power.jsonl import JsonlLogger
    from edgekit.power.latency import WindowStats
    from edgekit.power.policy import PolicyEngine
    from edgekit.power.sample import iso_time
    from edgekit.power.scrape import AttachedSource

    src = AttachedSource(url, window_s=pol.window_s)
    engine = PolicyEngine(pol)  # the same jitter rule (and cooldown) as the in-process watchdog
    logger = JsonlLogger(log) if log else None
    if logger:
        logger.meta(source=url, policy=pol.model_dump())
    done = _until(duration, samples)
    state = {"title": f"edgekit monitor attached to {url}", "budget_ms": pol.jitter_budget_ms, "events": [], "notes": []}
    polls = {"ok": 0, "failed": 0, "last_error": ""}

    def step(_t_mono: float) -> None:
        now = time.time()
        try:
            view = src.poll()
            state["notes"] = []
            polls["ok"] += 1
        except SensorError as e:
            state["notes"] = [f"unreachable: {e}"]
            polls["failed"] += 1
            polls["last_error"] = str(e)
            if json_out:
                _emit({"type": "error", "t_s": now, "message": str(e)})
            return
        rec = {"t_s": now, "time": iso_time(now), **view}
        lat = {m: s for m, s in view["latency"].items() if s.get("n")}
        events: list[Event] = []
        for m, st in lat.items():
            stats = WindowStats(m, st["n"], view["window_s"] or 0.0, st["p50_ms"], st["p95_ms"], st["p99_ms"],
                                float("nan"), float("nan"), float("nan"), float("nan"))
            for e in engine.check_window(stats, now):
                e.evidence["rule"] = "p99-p50 (from histogram buckets)"
                events.append(e)
        for key, n in view["events_new"].items():
            kind, severity = key.split("/", 1)
            events.append(Event(t_s=now, kind=kind, severity=severity if severity in ("info", "warning", "critical") else "warning",
                                message=f"{n:g} {kind} event(s) raised by the server's watchdog since the last poll",
                                evidence={"rule": "server counter", "events": n, "source": url}))
        event_dicts = [e.to_dict() for e in events]
        if json_out:
            _emit({"type": "scrape", **rec})
            for e in event_dicts:
                _emit({"type": "event", **e})
        else:
            state.update(latency=view["latency"], rails_mw=view["rails_mw"], total_mw=view.get("total_mw"),
                         total_source="server", rails_sum_mw=view.get("rails_sum_mw"), rails_sum_of=view.get("rails_sum_of"),
                         gpu_load_pct=view.get("gpu_load_pct"), temps_c=view["temps_c"])
            state["events"] = (state["events"] + event_dicts)[-8:]
            state["new_events"] = event_dicts
            absent = sorted(k for k, ok in view["sensors"].items() if not ok)
            state["notes"] = [f"sensors unavailable on the server: {', '.join(absent)}"] if absent else []
        if logger:
            if view["rails_mw"] or view.get("total_mw") is not None:
                logger.write({"type": "sample", "t_s": now, "source": "scrape", "rails_mw": view["rails_mw"],
                              "total_mw": view.get("total_mw"), "rails_sum_mw": view.get("rails_sum_mw"),
                              "rails_sum_of": view.get("rails_sum_of"), "temps_c": view["temps_c"],
                              "gpu_load_pct": view.get("gpu_load_pct")})
            if lat:
                logger.write({"type": "latency", "t_s": now, "metrics": {m: {"std_ms": None, **s} for m, s in lat.items()}})
            for e in event_dicts:
                logger.write({"type": "event", **e})

    try:
        _run_paced(step, done, interval_ms, None if json_out else state)
    finally:
        if logger:
            logger.close()
    if polls["ok"] == 0 and polls["failed"]:  # nothing was ever read: a failure, not an empty success
        raise SensorError(f"{url}: no answer in {polls['failed']} attempt(s) ({polls['last_error']})",
                          hint="start the server (edgekit serve BUNDLE ...) or pass --url of a running one")


@app.command()
def report(
    log: Path = typer.Argument(..., help="A watchdog JSONL log (from `edgekit monitor --log` or the runtime)."),
    out_dir: Path = typer.Option(..., "-o", "--out", help="Directory for the PNG plots and index.html."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary and file list as JSON."),
) -> None:
    """Render latency/jitter, power-per-rail and temperature plots (events marked) and an HTML page."""
    from rich.markup import escape

    from edgekit.cli_common import print_json
    from edgekit.output_path import check_output_path
    from edgekit.power.report import render_report, summary_rows

    check_output_path(out_dir, "-o", kind="dir")
    r = render_report(log, out_dir)
    if json_out:
        print_json({"html": str(r.html), "images": [str(p) for p in r.images], "summary": r.summary})
        return
    console.print(f"wrote [bold]{escape(str(r.html))}[/] and {', '.join(p.name for p in r.images) or 'no plots (no data)'}")
    for label, text in summary_rows(r.summary):
        console.print(f"[dim]{escape(label)}:[/] {escape(text)}")
