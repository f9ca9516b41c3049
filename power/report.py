"""`edgekit report`: PNG plots and a short HTML page from a watchdog JSONL log.

Figures (each only when the log has the data): latency percentiles over time
for each metric the watchdog measured (per token, time to first token, whole
request) and the jitter against its budget, power per rail with the total and
the band (with GPU/CPU load), and temperature per zone with the limits. Events are drawn as vertical lines on
every figure. Time is seconds since the first record and every figure spans the
whole log, so figures line up; every axis has its unit. Files are written
atomically (temp file, fsync, rename).

Absent means absent: a log without power readings says "no power sensor" and
gets no power figures; power and energy come only from samples that carry a
measured total (or, on boards without an input rail, the labelled sum of rails,
named as such), of one quantity (a sum missing a rail is a gap, not a lower
reading), and energy is integrated only between neighbouring samples that
both have a value, never across a gap.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.durable import replace_atomically
from edgekit.errors import EdgekitError
from edgekit.measured_on import CPU, in_words
from edgekit.power.band_quantity import BandQuantity, fullest
from edgekit.power.jsonl import LogContents, read_log
from edgekit.power.sample import rails_sum_label
from edgekit.power.sensors.power_mode import describe_power_mode

EVENT_COLOURS = {"jitter": "tab:red", "power_band": "tab:orange", "temperature": "tab:purple", "sensor": "tab:gray",
                 "over_current": "tab:brown", "throttle": "tab:pink"}
NO_POWER = "no power sensor"


@dataclass
class ReportResult:
    out_dir: Path
    html: Path
    images: list[Path] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def write_atomic(path: Path, data: bytes) -> None:
    """Atomic write (temp file, fsync, rename; the one implementation in edgekit.durable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, data)


def _save(fig, path: Path) -> None:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    write_atomic(path, buf.getvalue())


def _times(c: LogContents) -> list[float]:
    return [r["t_s"] for recs in (c.samples, c.latency, c.events) for r in recs if isinstance(r.get("t_s"), (int, float))]


def _t0(c: LogContents) -> float:
    ts = _times(c)
    return min(ts) if ts else 0.0


def _span_s(c: LogContents) -> float:
    ts = _times(c)
    return max(ts) - min(ts) if ts else 0.0


def sample_power(s: dict) -> tuple[float | None, str | None]:
    """(mW, what it is) of one logged sample: its measured total, else its labelled sum of rails, else nothing."""
    if s.get("total_mw") is not None:
        return float(s["total_mw"]), s.get("total_source") or "measured total"
    if s.get("rails_sum_mw") is not None:
        return float(s["rails_sum_mw"]), rails_sum_label(list(s.get("rails_sum_of") or []))
    return None, None


def board_power(samples: list[dict]) -> tuple[str | None, list[float | None]]:
    """(what it is, mW of each sample) of the board's power over a log: one quantity, the fullest it holds
    (edgekit.power.band_quantity); a sample that read less (a rail missing from its sum) has None, a gap, as one
    without power has."""
    quantities = [BandQuantity.of_record(s) for s in samples]
    held = fullest(quantities)
    powers = [sample_power(s) if q == held else (None, None) for s, q in zip(samples, quantities)]
    return next((w for _, w in powers if w), None), [mw for mw, _ in powers]


def _whole_log(ax, span_s: float) -> None:
    if span_s > 0:
        ax.set_xlim(0.0, span_s)
    else:  # one instant (a log of one sample): centred, not on the left edge of a 1 ms axis
        ax.set_xlim(-1.0, 1.0)


def _series(ax, t: list[float], y: list[float], *fmt: str, **kw) -> None:
    """``ax.plot`` with a dot on every reading that has no reading beside it: a line needs two points, so a log of
    one sample, or a reading between two gaps (NaN), was drawn as nothing at all."""
    def has(i: int) -> bool:
        return 0 <= i < len(y) and math.isfinite(y[i])

    alone = [i for i in range(len(y)) if has(i) and not has(i - 1) and not has(i + 1)]
    if alone:
        kw.update(marker="o", markersize=4, markevery=alone)
    ax.plot(t, y, *fmt, **kw)


def _event_label(e: dict) -> str:
    """Short text for an event line: its kind and the value that breached, with the unit."""
    ev = e.get("evidence") or {}
    kind = e.get("kind", "event")
    if kind == "jitter" and "value_ms" in ev:
        return f"jitter: {ev['value_ms']:.1f} ms token"
    if kind == "jitter" and "jitter_ms" in ev:
        return f"jitter: p99-p50 {ev['jitter_ms']:.1f} ms"
    if kind == "power_band" and "total_w" in ev:
        return f"power: {ev['total_w']:.1f} W"
    if kind == "temperature" and "temp_c" in ev:
        return f"{ev.get('zone', '?')}: {ev['temp_c']:.0f} °C"
    return kind


def _mark_events(ax, events: list[dict], t0: float, label: bool) -> None:
    for e in events:
        x = e["t_s"] - t0
        colour = EVENT_COLOURS.get(e.get("kind"), "black")
        ax.axvline(x, color=colour, linestyle=":", linewidth=1.2, alpha=0.9)
        if label:
            ax.annotate(_event_label(e), xy=(x, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -2),
                        textcoords="offset points", rotation=90, va="top", ha="left", fontsize=7, color=colour,
                        bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8})


def _policy(c: LogContents) -> dict:
    return (c.meta[0].get("policy") if c.meta else None) or {}


LATENCY_METRICS = (("token", "per-token latency"), ("ttft", "time to first token"), ("request", "request latency"))


def _latency_rows(c: LogContents, metric: str, t0: float) -> list[tuple[float, dict]]:
    return [(r["t_s"] - t0, r["metrics"][metric]) for r in c.latency if metric in (r.get("metrics") or {})]


def _latency_figure(c: LogContents, t0: float, path: Path) -> Path | None:
    fig = latency_figure(c, t0)
    if fig is None:
        return None
    _save(fig, path)
    return path


def latency_figure(c: LogContents, t0: float):
    """One panel per latency metric the log holds (token, TTFT, request: p50/p95/p99 over the rolling window), then
    the jitter (p99 - p50) of the metrics held to the budget, against the budget. Events on every panel. None
    without latency records (a power-only capture)."""
    from matplotlib.figure import Figure

    present = [(m, label) for m, label in LATENCY_METRICS if _latency_rows(c, m, t0)]
    if not present:
        return None
    pol = _policy(c)
    budget = pol.get("jitter_budget_ms", 5.0)
    budgeted = [m for m, _ in present if m in pol.get("jitter_metrics", ["token"])] or [present[0][0]]
    fig = Figure(figsize=(10, 2.6 * (len(present) + 1)), dpi=110, layout="constrained")
    axes = fig.subplots(len(present) + 1, 1, sharex=True)
    for ax, (metric, label) in zip(axes, present):
        rows = _latency_rows(c, metric, t0)
        t = [x for x, _ in rows]
        for q, style in (("p50_ms", "-"), ("p95_ms", "--"), ("p99_ms", "-")):
            _series(ax, t, [s[q] for _, s in rows], style, label=q.replace("_ms", ""), linewidth=1.4 if q != "p95_ms" else 1.0)
        ax.set_ylabel(f"{metric} (ms)")
        ax.set_title(f"{label} over a rolling window", fontsize=10)
        ax.legend(loc="upper left", fontsize=8, ncol=3)
        ax.grid(alpha=0.3)
        _mark_events(ax, c.events, t0, label=ax is axes[0])
    ax = axes[-1]
    top = budget
    for metric in budgeted:
        rows = _latency_rows(c, metric, t0)
        jit = [s["jitter_ms"] for _, s in rows]
        _series(ax, [x for x, _ in rows], jit, label=f"{metric} jitter p99 - p50")
        std = [s.get("std_ms") for _, s in rows]
        if any(v is not None for v in std):
            _series(ax, [x for x, _ in rows], [v if v is not None else float("nan") for v in std], linewidth=1.0,
                    label=f"{metric} standard deviation")
        top = max([top, *jit, *(v for v in std if v is not None)])
    ax.axhline(budget, color="black", linestyle="--", linewidth=1.0, label=f"budget {budget:g} ms")
    ax.set_ylim(0, top * 1.5)  # room above the budget line for the legend
    ax.set_ylabel("jitter (ms)")
    ax.set_title("jitter against the budget", fontsize=10)
    ax.set_xlabel("time since start of log (s)")
    ax.legend(loc="upper left", fontsize=8, ncol=3)
    ax.grid(alpha=0.3)
    _mark_events(ax, c.events, t0, label=False)
    _whole_log(ax, _span_s(c))
    return fig


def _power_figure(c: LogContents, t0: float, path: Path) -> Path | None:
    from matplotlib.figure import Figure

    if not any(s.get("rails_mw") or sample_power(s)[0] is not None for s in c.samples):
        return None
    samples = c.samples  # all of them: a sample without power is a gap in the lines, not joined over
    t = [s["t_s"] - t0 for s in samples]
    rails = sorted({r for s in samples for r in (s.get("rails_mw") or {})})
    what, powers = board_power(samples)
    loads = any(s.get("gpu_load_pct") is not None or s.get("cpu_load_pct") is not None for s in c.samples)
    fig = Figure(figsize=(10, 6.2 if loads else 4.4), dpi=110, layout="constrained")
    axes = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1]) if loads else [fig.subplots(1, 1)]
    ax = axes[0]
    total_src = next((s.get("total_source") for s in samples if s.get("total_source")), None)
    if what is not None:
        _series(ax, t, [(mw if mw is not None else float("nan")) / 1000.0 for mw in powers], color="black", linewidth=2.0,
                label=f"total = {what}" if _has_measured_total(samples) else what)
    for r in rails:
        if r == total_src:
            continue  # the input rail is the total line itself
        _series(ax, t, [(s.get("rails_mw") or {}).get(r, float("nan")) / 1000.0 for s in samples], label=r, linewidth=1.0)
    centre = _policy(c).get("power_target_w")
    if centre is None:
        centre = next((e["evidence"].get("centre_w") for e in c.events if e.get("kind") == "power_band"), None)
    band = _policy(c).get("power_band_w", 3.0)
    if centre is not None:
        ax.axhspan(centre - band, centre + band, color="tab:green", alpha=0.12, label=f"band {centre:g} ± {band:g} W")
    ax.set_ylabel("power (W)")
    ax.set_title("power per rail and total" if _has_measured_total(samples) else "power per rail and their sum (no input rail measured)")
    ax.legend(loc="upper left", fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    _mark_events(ax, c.events, t0, label=True)
    if loads:
        ax2 = axes[1]
        tl = [s["t_s"] - t0 for s in c.samples]
        for key, name in (("gpu_load_pct", "GPU load"), ("cpu_load_pct", "CPU load")):
            if any(s.get(key) is not None for s in c.samples):
                _series(ax2, tl, [s.get(key) if s.get(key) is not None else float("nan") for s in c.samples], label=name)
        ax2.set_ylabel("load (%)")
        ax2.set_ylim(0, 105)
        ax2.legend(loc="upper left", fontsize=8)
        ax2.grid(alpha=0.3)
        _mark_events(ax2, c.events, t0, label=False)
    axes[-1].set_xlabel("time since start of log (s)")
    _whole_log(axes[-1], _span_s(c))
    _save(fig, path)
    return path


def _has_measured_total(samples: list[dict]) -> bool:
    return any(s.get("total_mw") is not None for s in samples)


def _temperature_figure(c: LogContents, t0: float, path: Path) -> Path | None:
    from matplotlib.figure import Figure

    zones = sorted({z for s in c.samples for z in (s.get("temps_c") or {})})
    if not zones:
        return None
    t = [s["t_s"] - t0 for s in c.samples]
    fig = Figure(figsize=(10, 4.0), dpi=110, layout="constrained")
    ax = fig.subplots(1, 1)
    for z in zones:
        _series(ax, t, [(s.get("temps_c") or {}).get(z, float("nan")) for s in c.samples], label=z, linewidth=1.0)
    lim = _policy(c).get("temperature") or {}
    for key, style in (("warn_c", "--"), ("critical_c", "-")):
        if key in lim:
            ax.axhline(lim[key], color="tab:red", linestyle=style, linewidth=1.0, label=f"{key.replace('_c', '')} {lim[key]:g} °C")
    ax.set_ylabel("temperature (°C)")
    ax.set_xlabel("time since start of log (s)")
    _whole_log(ax, _span_s(c))
    ax.set_title("temperature per thermal zone")
    ax.legend(loc="upper left", fontsize=8, ncol=3)
    ax.grid(alpha=0.3)
    _mark_events(ax, c.events, t0, label=True)
    _save(fig, path)
    return path


def _energy(points: list[tuple[float, float | None]]) -> tuple[float, float] | None:
    """(J, seconds covered): trapezoids between neighbouring samples that both have power, skipping gaps
    longer than 5 typical intervals (the watchdog was paused, or samples were lost)."""
    gaps = [b[0] - a[0] for a, b in zip(points, points[1:]) if b[0] > a[0]]
    if not gaps:
        return None
    longest = 5 * sorted(gaps)[len(gaps) // 2]
    joules = covered = 0.0
    for (ta, wa), (tb, wb) in zip(points, points[1:]):
        if wa is None or wb is None or not 0 < tb - ta <= longest:
            continue
        joules += (tb - ta) * (wa + wb) / 2
        covered += tb - ta
    return (joules, covered) if covered > 0 else None


def summarise(c: LogContents) -> dict[str, Any]:
    meta = c.meta[0] if c.meta else {}
    out: dict[str, Any] = {
        "duration_s": round(_span_s(c), 3),
        "samples": len(c.samples),
        "latency_records": len(c.latency),
        "events": len(c.events),
        "events_by_kind": {k: sum(1 for e in c.events if e.get("kind") == k) for k in sorted({e.get("kind") for e in c.events})},
        "skipped_lines": len(c.skipped_lines),
        "source": meta.get("source"),
        "sensors": meta.get("sensors") or None,
    }
    if "power_mode" in meta:  # None: the logging machine had no readable nvpmodel; absent: not recorded (replays)
        out["power_mode"] = meta["power_mode"]
    what, powers = board_power(c.samples)
    points = [(s["t_s"], None if mw is None else mw / 1000.0) for s, mw in zip(c.samples, powers)]
    watts = [w for _, w in points if w is not None]
    if not watts:
        out["power"] = NO_POWER
    else:
        out["power_source"] = what
        out["power_mean_w"] = round(sum(watts) / len(watts), 3)
        out["power_peak_w"] = round(max(watts), 3)
        out["power_samples"] = len(watts)
        e = _energy(points)
        if e is not None:  # only as good as the sampling rate: an estimate, and labelled so
            out["energy_j_from_samples"] = round(e[0], 3)
            out["energy_covers_s"] = round(e[1], 3)
    busy = [r for r in c.latency if r.get("metrics")]  # an idle server's last record is its emptied window
    if c.latency:  # older logs do not say; then neither does the report
        out["latency_measured_on"] = ", ".join(dict.fromkeys(r["measured_on"] for r in c.latency if r.get("measured_on"))) or None
    if busy:
        last = busy[-1]["metrics"]
        out["latency_last_window"] = {m: {k: s.get(k) for k in ("n", "p50_ms", "p99_ms", "jitter_ms", "std_ms")} for m, s in last.items()}
    return out


def latency_source_in_words(values: str) -> str:
    """The summary's ``latency_measured_on`` (values joined by ", ") as the report says it: a CPU's latencies are
    edgekit's reference operators there, so the report says they are not the target device's (the budgets are)."""
    out = []
    for value in values.split(", "):
        words = in_words(value)
        out.append(words + (" (edgekit's reference operators; not the target device)" if value == CPU else ""))
    return "; ".join(out)


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary as (label, text) rows with units and rounded numbers, for the terminal and the HTML page."""
    rows = [("duration", f"{summary['duration_s']:.1f} s"),
            ("records", f"{summary['samples']} samples, {summary['latency_records']} latency windows, {summary['events']} events")]
    if summary.get("source"):
        rows.append(("source", str(summary["source"])))
    if "power_mode" in summary:
        rows.append(("power mode", describe_power_mode(summary.get("power_mode"))))
    if summary.get("sensors"):
        rows.append(("sensors", ", ".join(map(str, summary["sensors"]))))
    if summary.get("power") == NO_POWER:
        rows.append(("power", NO_POWER))
    elif "power_mean_w" in summary:
        rows.append(("power", f"mean {summary['power_mean_w']:.2f} W, peak {summary['power_peak_w']:.2f} W "
                              f"({summary['power_source']}; {summary['power_samples']} of {summary['samples']} samples)"))
        if "energy_j_from_samples" in summary:
            rows.append(("energy", f"{summary['energy_j_from_samples']:.1f} J over {summary['energy_covers_s']:.1f} s "
                                   "(integrated from the sampled power)"))
    by_kind = summary.get("events_by_kind") or {}
    rows.append(("events", ", ".join(f"{k} {n}" for k, n in by_kind.items()) or "none"))
    if summary.get("latency_measured_on"):
        rows.append(("latency", latency_source_in_words(summary["latency_measured_on"])))
    for m, st in (summary.get("latency_last_window") or {}).items():
        def ms(k: str) -> str:
            return "—" if st.get(k) is None else f"{st[k]:.2f} ms"
        rows.append((f"{m} latency, last window", f"n={st.get('n')}, p50 {ms('p50_ms')}, p99 {ms('p99_ms')}, "
                                                   f"jitter {ms('jitter_ms')}, std {ms('std_ms')}"))
    if summary.get("skipped_lines"):
        rows.append(("lines skipped", str(summary["skipped_lines"])))
    return rows


def render_report(log_path: str | Path, out_dir: str | Path) -> ReportResult:
    c = read_log(log_path)
    if not (c.samples or c.latency or c.events):
        # say what the file holds: "0 lines were not JSONL records" read as a fault in an empty log, and a log
        # whose monitor was stopped before its first sample holds only its meta record
        held = ("it is empty" if not (c.skipped_lines or c.meta) else
                f"it holds only its meta record{'s' if len(c.meta) > 1 else ''}: the monitor stopped before its first "
                "sample" if not c.skipped_lines else f"{len(c.skipped_lines)} lines were not JSONL records")
        raise EdgekitError(
            f"{log_path}: no watchdog records found ({held})",
            hint="pass a log written by `edgekit monitor --log FILE`; for a tegrastats log run "
                 "`edgekit monitor --tegrastats-log FILE --log out.jsonl` first",
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = _t0(c)
    images = [p for p in (
        _latency_figure(c, t0, out / "latency.png"),
        _power_figure(c, t0, out / "power.png"),
        _temperature_figure(c, t0, out / "temperature.png"),
    ) if p is not None]
    summary = summarise(c)
    page = _html(Path(log_path), c, images, summary, t0)
    write_atomic(out / "index.html", page.encode("utf-8"))
    return ReportResult(out, out / "index.html", images, summary)


def _html(log_path: Path, c: LogContents, images: list[Path], summary: dict, t0: float) -> str:
    esc = html.escape
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in summary_rows(summary))
    power_note = ("This log holds no power readings (no power sensor); nothing is shown as 0 W."
                  if summary.get("power") == NO_POWER else
                  "Power and temperatures are as the board's sensors reported them; energy is integrated from the sampled power "
                  "between neighbouring samples that both have a reading.")
    figs = "".join(f'<figure><img src="{esc(p.name)}" alt="{esc(p.stem)}"><figcaption>{esc(p.stem)}</figcaption></figure>' for p in images)
    ev_rows = "".join(
        f"<tr><td>{e['t_s'] - t0:.3f}</td><td>{esc(str(e.get('kind')))}</td><td>{esc(str(e.get('severity')))}</td>"
        f"<td>{esc(str(e.get('message')))}</td>"
        f"<td>{esc('; '.join(a.get('action', '?') + ': ' + a.get('status', '?') + (' (' + a['detail'] + ')' if a.get('detail') else '') for a in e.get('actions') or []))}</td></tr>"
        for e in c.events
    ) or '<tr><td colspan="5">no events</td></tr>'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>edgekit watchdog report: {esc(log_path.name)}</title>
<style>body{{font-family:sans-serif;max-width:1150px;margin:1em auto;padding:0 1em}}
table{{border-collapse:collapse;margin:.5em 0}}td,th{{border:1px solid #ccc;padding:.2em .5em;text-align:left;font-size:.9em}}
img{{max-width:100%}}figure{{margin:1em 0}}</style></head><body>
<h1>Watchdog report</h1>
<p>Log: <code>{esc(str(log_path))}</code>. Times are seconds since the first record. {esc(power_note)}</p>
<h2>Summary</h2><table>{rows}</table>
<h2>Plots</h2>{figs or '<p>no plottable data</p>'}{'' if c.latency else '<p>No latency records in this log (a power-only capture, e.g. a replayed tegrastats log).</p>'}
<h2>Events</h2><table><tr><th>time (s)</th><th>kind</th><th>severity</th><th>message</th><th>actions</th></tr>{ev_rows}</table>
</body></html>
"""
