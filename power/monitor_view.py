"""The views of `edgekit monitor`: a live table on a terminal (rich renderables from plain data), and one plain
line per sample (and per event) anywhere else, each at most ``LINE_WIDTH`` characters, for logs and pipes."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text


ABSENT = "—"  # a reading nobody took: never shown as 0
LINE_WIDTH = 200  # a piped monitor once wrote 300 000-character lines (a table stretched to an unbounded width)


def _f(v: Any, fmt: str = "{:.2f}") -> str:
    return ABSENT if v is None else fmt.format(v)


def render(state: dict[str, Any]) -> Group:
    """state: title, latency {metric: {n, p50_ms, p95_ms, p99_ms, jitter_ms, std_ms}}, budget_ms,
    rails_mw, total_mw, total_source, rails_sum_mw, rails_sum_of, gpu_load_pct, cpu_load_pct, temps_c,
    placeholder_temps_c, events [dict], notes [str]. Missing values are shown as "—"."""
    parts: list[Any] = [Text(state.get("title", "edgekit monitor"), style="bold")]
    budget = state.get("budget_ms")
    lat = Table(title="latency (rolling window, ms)", expand=False)
    for col in ("metric", "n", "p50", "p95", "p99", "jitter p99-p50", "std"):
        lat.add_column(col, justify="right" if col != "metric" else "left")
    if state.get("latency"):
        for m, s in state["latency"].items():
            j = s.get("jitter_ms")
            style = "red" if (budget is not None and j is not None and j > budget) else ""
            lat.add_row(m, str(s.get("n", 0)), _f(s.get("p50_ms")), _f(s.get("p95_ms")), _f(s.get("p99_ms")),
                        Text(_f(j), style=style), _f(s.get("std_ms")))
    else:
        lat.add_row(ABSENT, ABSENT, ABSENT, ABSENT, ABSENT, ABSENT, ABSENT)
    if budget is not None:
        lat.caption = f"jitter budget {budget:g} ms"
    parts.append(lat)

    pw = Table(title="power per rail", expand=False)
    pw.add_column("rail")
    pw.add_column("W", justify="right")
    rails = state.get("rails_mw") or {}
    for rail, mw in rails.items():
        pw.add_row(rail, f"{mw / 1000:.3f}")
    total, rails_sum = state.get("total_mw"), state.get("rails_sum_mw")
    if total is not None:
        pw.add_row(Text(f"total ({state.get('total_source') or 'measured'})", style="bold"), Text(f"{total / 1000:.3f}", style="bold"))
    elif rails_sum is not None:  # the board measures no input: say what the figure adds up
        pw.add_row(Text("sum of rails (no input rail measured)", style="bold"), Text(f"{rails_sum / 1000:.3f}", style="bold"))
    elif not rails:
        pw.add_row(Text("no power sensor", style="dim"), ABSENT)
    else:
        pw.add_row(Text("total (input rail unreadable)", style="bold"), ABSENT)
    pw.add_row("GPU load", _f(state.get("gpu_load_pct"), "{:.1f} %"))
    pw.add_row("CPU load", _f(state.get("cpu_load_pct"), "{:.1f} %"))
    temps = Table(title="temperature (°C)", expand=False)
    temps.add_column("zone")
    temps.add_column("°C", justify="right")
    for z, c in (state.get("temps_c") or {}).items():
        temps.add_row(z, f"{c:.1f}")
    for z, c in (state.get("placeholder_temps_c") or {}).items():
        temps.add_row(Text(f"{z} (placeholder)", style="dim"), Text(f"{c:.0f}", style="dim"))
    if not state.get("temps_c") and not state.get("placeholder_temps_c"):
        temps.add_row(Text("no temperature sensor", style="dim"), ABSENT)
    side = Table.grid(padding=(0, 4))
    side.add_row(pw, temps)
    parts.append(side)

    ev = Table(title="events (latest last)", expand=True)
    for col in ("time", "kind", "severity", "message", "actions"):
        ev.add_column(col, overflow="fold")
    for e in (state.get("events") or [])[-8:]:
        acts = "; ".join(f"{a['action']}: {a['status']}" for a in e.get("actions", []))
        ev.add_row(str(e.get("time") or round(e.get("t_s", 0), 3)), e.get("kind", ""), e.get("severity", ""), e.get("message", ""), acts or ABSENT)
    if not state.get("events"):
        ev.add_row(ABSENT, ABSENT, ABSENT, "no events", ABSENT)
    parts.append(ev)
    for n in state.get("notes") or []:
        parts.append(Text(n, style="dim"))
    return Group(*parts)


def fit_line(text: str, width: int = LINE_WIDTH) -> str:
    """``text`` on one line of at most ``width`` characters (cut with an ellipsis)."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def render_line(state: dict[str, Any], clock: str) -> str:
    """One sample as one line: time, latency of each metric, power (total or labelled sum, then rails), loads and
    temperatures; absent readings are "—". Cut to ``LINE_WIDTH`` characters."""
    parts = [clock]
    budget = state.get("budget_ms")
    for m, s in (state.get("latency") or {}).items():
        if s.get("n"):
            over = " OVER BUDGET" if budget is not None and (s.get("jitter_ms") or 0) > budget else ""
            parts.append(f"{m} p50 {_f(s.get('p50_ms'))} p99 {_f(s.get('p99_ms'))} jitter {_f(s.get('jitter_ms'))} ms{over}")
    total, rails_sum = state.get("total_mw"), state.get("rails_sum_mw")
    if total is not None:
        parts.append(f"power {total / 1000:.2f} W ({state.get('total_source') or 'measured'})")
    elif rails_sum is not None:
        parts.append(f"power {rails_sum / 1000:.2f} W (sum of rails)")
    else:
        parts.append(f"power {ABSENT}")
    rails = state.get("rails_mw") or {}
    if rails:
        parts.append(" ".join(f"{r} {mw / 1000:.2f}" for r, mw in rails.items()))
    parts.append(f"GPU {_f(state.get('gpu_load_pct'), '{:.0f}%')} CPU {_f(state.get('cpu_load_pct'), '{:.0f}%')}")
    temps = state.get("temps_c") or {}
    parts.append("temp " + (" ".join(f"{z} {c:.0f}°C" for z, c in temps.items()) if temps else ABSENT))
    return fit_line(" | ".join(parts))


def render_event_line(event: dict[str, Any]) -> str:
    """One event as one line (kind, severity, message, what its actions did), cut to ``LINE_WIDTH`` characters."""
    acts = "; ".join(f"{a.get('action')}: {a.get('status')}" for a in event.get("actions") or [])
    text = f"event {event.get('kind', '?')} ({event.get('severity', '?')}): {event.get('message', '')}"
    return fit_line(text + (f" [{acts}]" if acts else ""))
