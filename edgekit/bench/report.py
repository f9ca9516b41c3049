"""The benchmark as rich tables: one row per (model, precision, engine, context), then ratios and goals."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from edgekit.bench.document import NEAR_TIE, PARTITION_ENGINE, WIN_TOLERANCE, BenchDocument, Row
from edgekit.measured_on import in_words

SHORT_ENGINE = {"edgekit": "edgekit", "edgekit-fused": "edgekit fused", "compile": "torch.compile", "hf-eager": "HF eager", "hf-compile": "HF static+compile",
                "llama.cpp": "llama.cpp"}


def _f(x, fmt: str, none: str = "-") -> str:
    return none if x is None else format(x, fmt)


def _tokens_cell(r: Row) -> str:
    if r.tokens_match is None:
        return "-"
    if r.tokens_match:
        return f"[green]{r.tokens_checked}/{r.tokens_checked}[/]"
    if r.margin_at_mismatch is not None and r.logit_scale_at_mismatch:
        rel = r.margin_at_mismatch / r.logit_scale_at_mismatch
        tie = "near-tie" if rel < NEAR_TIE else "WIDE"
        return f"[bold red]differs @{r.first_mismatch}[/] ({tie}, margin {r.margin_at_mismatch:.3g})"
    return f"[bold red]differs @{r.first_mismatch}[/]"


def rows_table(doc: BenchDocument) -> Table:
    t = Table(title=f"edgekit bench: batch-1 decode and prefill, {in_words(doc.measured_on)}", title_justify="left")
    for name, just in (("model", "left"), ("prec", "left"), ("engine", "left"), ("ctx", "right"), ("decode tok/s", "right"),
                       ("ms/tok", "right"), ("prefill tok/s", "right"), ("TTFT ms", "right"), ("peak MiB", "right"),
                       ("W", "right"), ("mJ/tok", "right"), ("roofline", "right"), ("tokens", "left")):
        t.add_column(name, justify=just)
    for r in doc.rows:
        if r.engine == PARTITION_ENGINE:
            continue  # their own table (partitions_table)
        model = r.model.removeprefix("preset:")
        if r.status != "ok":
            colour = "red" if r.status == "failed" else "yellow"
            t.add_row(model, r.precision, SHORT_ENGINE.get(r.engine, r.engine), str(r.context),
                      f"[{colour}]{r.status}[/]", "", "", "", "", "", "", "", f"[{colour}]{(r.error or '')[:60]}[/]")
            continue
        prefill = _f(r.prefill_tokens_per_s, ",.0f")
        if r.prefill_graphed_tokens_per_s:
            prefill += f" ({r.prefill_graphed_tokens_per_s:,.0f} graphed)"
        t.add_row(
            model, r.precision, SHORT_ENGINE.get(r.engine, r.engine), str(r.context),
            _f(r.decode_tokens_per_s, ",.1f"), _f(r.decode_ms_per_token, ".3f"), prefill, _f(r.ttft_ms, ".2f"),
            _f(None if r.peak_memory_bytes is None else r.peak_memory_bytes / 2**20, ",.0f"),
            _f(r.power_w, ".0f"), _f(r.energy_mj_per_token, ".2f"),
            _f(None if r.roofline is None or r.roofline.fraction is None else 100 * r.roofline.fraction, ".0f") + ("%" if r.roofline else ""),
            _tokens_cell(r),
        )
    return t


def _sms_cell(r: Row) -> str:
    p = r.partition
    if not p.confined:
        return f"{p.requested_sms} [yellow](not confined)[/]"
    got = "?" if p.sm_count is None else str(p.sm_count)
    seen = "" if p.observed_sms is None else f", {p.observed_sms} seen"
    return (f"{got}{seen}" if p.sm_count == p.requested_sms else f"{p.requested_sms} -> {got}{seen}") + f" of {p.device_sms}"


def partitions_table(doc: BenchDocument) -> Table:
    """The --sms rows: one per (model, precision, SMs, tile candidate, context)."""
    t = Table(title=f"Orin-shaped: the fused decode confined to part of the GPU's SMs (CUDA green contexts), "
                    f"{in_words(doc.measured_on)}", title_justify="left")
    for name, just in (("model", "left"), ("prec", "left"), ("SMs", "left"), ("tiles", "left"), ("rules@SMs", "right"),
                       ("ctx", "right"), ("decode tok/s", "right"), ("copy GB/s", "right"), ("roofline", "right"),
                       ("vs all SMs", "right"), ("tokens", "left")):
        t.add_column(name, justify=just)
    whole = {(r.model, r.precision, r.context): r.decode_tokens_per_s for r in doc.rows
             if r.engine == "edgekit-fused" and r.status == "ok"}
    for r in doc.rows:
        if r.engine != PARTITION_ENGINE or r.partition is None:
            continue
        p = r.partition
        head = (r.model.removeprefix("preset:"), r.precision, _sms_cell(r), p.tiles, _f(p.launch_rule_sms, "d"), str(r.context))
        if r.status != "ok":
            colour = "red" if r.status == "failed" else "yellow"
            t.add_row(*head, f"[{colour}]{r.status}[/]", "", "", "", f"[{colour}]{(r.error or '')[:70]}[/]")
            continue
        full = whole.get((r.model, r.precision, r.context))
        t.add_row(*head, _f(r.decode_tokens_per_s, ",.1f"),
                  _f(None if p.copy_bytes_per_s is None else p.copy_bytes_per_s / 1e9, ",.0f"),
                  _f(None if r.roofline is None or r.roofline.fraction is None else 100 * r.roofline.fraction, ".0f")
                  + ("%" if r.roofline else ""),
                  _f(None if not full else r.decode_tokens_per_s / full, ".2f") + ("x" if full else ""),
                  _tokens_cell(r))
    return t


def partition_lines(doc: BenchDocument) -> list[str]:
    """Per (model, precision, SMs, context): the winning tiles, and the orin plan's against them; the orin tiles."""
    out, tiles_shown = [], set()
    for q in doc.sm_partitions:
        name = f"{q.model.removeprefix('preset:')} {q.precision} {q.sm_count or q.requested_sms} SMs ctx {q.context}"
        if not q.decode_tokens_per_s:
            out.append(f"{name}: nothing measured ({q.detail or 'no row ran'})")
            continue
        line = f"{name}: best {q.best} {q.decode_tokens_per_s[q.best]:,.1f} tok/s"
        if q.orin_plan_vs_best is not None:
            verdict = "wins" if q.orin_plan_vs_best >= 1 else (
                f"wins within {100 * WIN_TOLERANCE:.0f}%" if q.orin_plan_wins else "[bold red]loses[/]")
            line += f"; orin plan {q.orin_plan_vs_best:.3f}x of it ({verdict})"
        if not q.confined:
            line += " [yellow](not confined)[/]"
        out.append(line)
        key = (q.model, q.precision)
        if q.orin_tiles and key not in tiles_shown:
            tiles_shown.add(key)
            out.append(f"  orin plan's fused-step tiles for {q.model.removeprefix('preset:')} {q.precision}: "
                       + "; ".join(v for v in q.orin_tiles.values()))  # labels: kernel[constexprs] warps stages dtype
    return out


def ratios_table(doc: BenchDocument) -> Table:
    t = Table(title=f"edgekit runtime / baseline (same model, context and run; {in_words(doc.measured_on)})", title_justify="left")
    for name in ("model", "ctx", "edgekit", "baseline", "decode speed-up", "TTFT speed-up"):
        t.add_column(name, justify="right" if "speed" in name or name == "ctx" else "left")
    for q in doc.ratios:
        t.add_row(q.model.removeprefix("preset:"), str(q.context), f"{SHORT_ENGINE.get(q.engine, q.engine)} {q.precision}",
                  f"{SHORT_ENGINE.get(q.baseline, q.baseline)} {q.baseline_precision}",
                  f"{q.decode_speedup:.2f}x", _f(q.ttft_speedup, ".2f") + ("x" if q.ttft_speedup else ""))
    return t


def goals_table(doc: BenchDocument) -> Table:
    t = Table(title="goals (H200)", title_justify="left")
    for name in ("goal", "model", "prec", "ctx", "target", "measured", "met", "detail"):
        t.add_column(name)
    for g in doc.goals:
        roof = "roofline" in g.goal
        fmt = (lambda v: f"{100 * v:.0f}%") if roof else (lambda v: f"{v:.2f}x")
        met = "-" if g.met is None else ("[green]yes[/]" if g.met else "[bold red]no[/]")
        t.add_row(g.goal, g.model.removeprefix("preset:"), g.precision, str(g.context), fmt(g.target),
                  "-" if g.measured is None else fmt(g.measured), met, g.detail)
    return t


def profile_lines(doc: BenchDocument) -> list[str]:
    """One line per profiled edgekit row: where the graphed decode step spends its time."""
    out = []
    for r in doc.rows:
        p = r.profile
        if r.status != "ok" or not p:
            continue
        if "error" in p:
            out.append(f"{r.model.removeprefix('preset:')} {r.precision} ctx {r.context}: profile failed: {p['error']}")
            continue
        top = ", ".join(f"{k['name'].split('<')[0][:28]} {k['us_per_token']:.0f} us ({k['per_token']:.0f}x)" for k in p["top_kernels"][:3])
        out.append(f"{r.model.removeprefix('preset:')} {r.precision} ctx {r.context}: {p['kernels_per_token']:.0f} kernels/token, "
                   f"{p['kernel_ms_per_token']:.3f} ms in kernels of {p['wall_ms_per_token']:.3f} ms wall; top: {top}")
    return out


def print_report(doc: BenchDocument, console: Console) -> None:
    console.print(rows_table(doc))
    lines = profile_lines(doc)
    if lines:
        console.print(f"edgekit decode step, CUDA-graph replay profiled with torch.profiler ({in_words(doc.measured_on)}):")
        for line in lines:
            console.print(f"  {line}", highlight=False)
    if doc.copy_bandwidth:
        console.print(f"roofline = copy bandwidth {doc.copy_bandwidth['bytes_per_s'] / 1e9:,.0f} GB/s ("
                      f"{in_words(doc.measured_on)}, same run) / bytes read per decoded token (weights at their precision + KV cache)")
    if any(r.engine == PARTITION_ENGINE for r in doc.rows):
        console.print(partitions_table(doc))
        for line in partition_lines(doc):
            console.print(f"  {line}", highlight=False)
    if doc.ratios:
        console.print(ratios_table(doc))
    if doc.goals:
        console.print(goals_table(doc))
    for m in doc.mismatches:
        console.print(f"[bold red]TOKEN MISMATCH:[/] {m}")
    for n in doc.notes:
        console.print(f"[dim]note: {n}[/]")
