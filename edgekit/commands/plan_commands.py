"""`edgekit targets` and `edgekit plan`: the device profiles, and what a build would do on one."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from edgekit.cli import app
from edgekit.cli_common import cli_precision, console, err_console, fmt_bytes, print_json
from edgekit.strict_json import write_json_file
from edgekit.precision_names import BUILD_PRECISIONS, DEFAULT_PRECISION
from edgekit.precision_names import help_text as precision_help

TARGETS_DIR_HELP = "A directory of extra target YAML files (also: EDGEKIT_TARGETS_DIR); a file there replaces a built-in of the same name."
MODEL_HELP = "A .gguf file, a Hugging Face model directory, preset:NAME, or omitted for the default model (SmolLM2-135M-Instruct)."

targets_app = typer.Typer(
    name="targets",
    help="List the device profiles (built-in and from --targets-dir), or show one.",
    invoke_without_command=True,
    no_args_is_help=False,
)
app.add_typer(targets_app)


@targets_app.callback()
def targets_list(
    ctx: typer.Context,
    targets_dir: Optional[Path] = typer.Option(None, "--targets-dir", help=TARGETS_DIR_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List every target: arch, SMs, memory, bandwidth, peaks, shared-memory budget and power modes."""
    if ctx.invoked_subcommand is not None:
        # `targets --json show NAME` asks show for JSON: printing tables there broke a script piping it to jq
        ctx.obj = {"targets_dir": targets_dir, "json": json_out}
        return
    from edgekit.plan.targets import discover_targets

    found = discover_targets(targets_dir)
    if json_out:
        print_json([{**tf.target.summary(), "path": str(tf.path), "builtin": tf.builtin} for tf in found.values()])
        return
    t = Table(title="Targets")
    user = any(not tf.builtin for tf in found.values())
    for col in ("name", "arch", "SMs", "memory", "GB/s", "INT8 TOPS", "smem budget", "modes") + (("from",) if user else ()):
        t.add_column(col, justify="right" if col in ("SMs", "GB/s", "INT8 TOPS", "smem budget") else "left",
                     no_wrap=col in ("name", "arch", "memory"))
    for name, tf in sorted(found.items()):
        tg = tf.target
        t.add_row(
            name, tg.arch, str(tg.gpu.sms),
            f"{tg.memory.total_gib:g} GiB" + (" U" if tg.memory.unified else ""),
            f"{tg.memory.dram_bandwidth_gbps:g}", f"{tg.gpu.int8_dense_tops:g}", f"{tg.smem_budget_bytes // 1024} KiB",
            f"{len(tg.power_modes)} ({tg.default_power_mode})", *((("built-in" if tf.builtin else str(tf.path)),) if user else ()),
        )
    console.print(t)
    for name, tf in sorted(found.items()):
        console.print(f"[bold]{name}[/]: {tf.target.description}", highlight=False)
    console.print("[dim]U: unified memory (shared with the CPU). modes: count (default). INT8 TOPS: dense, all SMs at the top clock, derived. "
                  "`edgekit targets show NAME` for the power modes.[/]")


@targets_app.command("show")
def targets_show(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="A target name (see `edgekit targets`) or a path to a target YAML file."),
    targets_dir: Optional[Path] = typer.Option(None, "--targets-dir", help=TARGETS_DIR_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print the validated profile as JSON."),
) -> None:
    """Every field of one target, and each power mode's derived peaks."""
    from edgekit.plan.targets import load_target

    targets_dir = targets_dir or (ctx.obj or {}).get("targets_dir")
    json_out = json_out or (ctx.obj or {}).get("json", False)
    tg = load_target(name, targets_dir)
    if json_out:
        d = tg.model_dump(mode="json")
        d["derived"] = {m.name: {"int8_tops": tg.mode_int8_tops(m), "fp16_tflops": tg.mode_fp16_tflops(m)} for m in tg.power_modes}
        print_json(d)
        return
    t = Table(title=f"{tg.name}: {tg.description}", show_header=False)
    g, sm, mem = tg.gpu, tg.gpu.shared_memory, tg.memory
    rows = [
        ("arch / family", f"{g.arch} / {tg.family}"),
        ("SMs / max clock", f"{g.sms} / {g.max_clock_mhz:g} MHz"),
        ("INT8 dense TOPS / FP16 dense TFLOPS", f"{g.int8_dense_tops:g} / {g.fp16_dense_tflops:g}"),
        ("shared memory per block: budget", f"{sm.per_block_budget_bytes} B ({sm.per_block_budget_bytes / 1024:g} KiB)"),
        ("  default / opt-in max / per SM", f"{sm.per_block_default_bytes} / {sm.per_block_optin_bytes} / {sm.per_sm_bytes} B"),
        ("registers per SM / per thread max", f"{g.registers_per_sm} / {g.max_registers_per_thread}"),
        ("threads / blocks per SM", f"{g.max_threads_per_sm} / {g.max_blocks_per_sm}"),
        ("L2", fmt_bytes(g.l2_bytes)),
        ("memory", f"{mem.total_gib:g} GiB" + (" (unified with the CPU)" if mem.unified else "")),
        ("OS headroom / runtime reserve", f"{mem.os_headroom_gib:g} GiB / {mem.runtime_reserve_gib:g} GiB"),
        ("DRAM bandwidth (peak)", f"{mem.dram_bandwidth_gbps:g} GB/s"),
        ("watchdog: jitter budget / power band", f"{tg.watchdog.jitter_budget_ms:g} ms / ±{tg.watchdog.power_band_w:g} W"),
        ("watchdog: temperature warn / limit", f"{tg.watchdog.temperature_warn_c:g} / {tg.watchdog.temperature_limit_c:g} °C"),
        ("roofline assumptions", f"bandwidth x{tg.roofline.bandwidth_efficiency:g}, compute x{tg.roofline.compute_efficiency:g}, "
                                 f"{tg.roofline.kernel_overhead_us:g} µs per kernel"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    pm = Table(title="Power modes (peaks derived: module peak x active SMs x clock)")
    for col in ("mode", "nvpmodel id", "budget W", "SMs", "GPU MHz", "DRAM GB/s", "INT8 TOPS", "FP16 TFLOPS"):
        pm.add_column(col, justify="left" if col == "mode" else "right")
    for m in tg.power_modes:
        label = m.name + (" (default)" if m.name == tg.default_power_mode else "") + (" [super]" if m.super_config else "")
        pm.add_row(label, "-" if m.nvpmodel_id is None else str(m.nvpmodel_id), f"{m.power_budget_w:g}", str(m.active_sms),
                   f"{m.gpu_max_clock_mhz:g}", f"{m.dram_bandwidth_gbps:g}", f"{tg.mode_int8_tops(m):.1f}", f"{tg.mode_fp16_tflops(m):.1f}")
    console.print(pm)


@app.command()
def plan(
    model: Optional[str] = typer.Argument(None, help=MODEL_HELP),
    target: str = typer.Option("orin", "--target", "-t", help="Target name (see `edgekit targets`) or a target YAML file."),
    context: Optional[int] = typer.Option(None, "--context", min=16, help="KV cache length in tokens (prompt + answer). Default: 2048, or less if the model has fewer positions."),
    batch: int = typer.Option(1, "--batch", min=1, help="The most sequences the device decodes together (a static shape: the KV cache, memory, tiles and predictions are sized for it; serve runs batch buckets 1, 2, 4, ... up to it)."),
    trace: Optional[Path] = typer.Option(None, "--trace", help='JSONL of real requests, one {"prompt_tokens": N, "completion_tokens": M} per line: buckets are chosen to minimise padding on it.'),
    buckets: Optional[str] = typer.Option(None, "--buckets", help="Prompt buckets to use, e.g. 64,128,512 (overrides the choice; a --trace still reports coverage and waste)."),
    max_buckets: int = typer.Option(6, "--max-buckets", min=1, max=32, help="At most this many buckets when choosing from a trace."),
    precision: str = typer.Option(DEFAULT_PRECISION, "--precision", help="Block projections: " + precision_help(BUILD_PRECISIONS) + " The same default as `edgekit build`."),
    kv_precision: str = typer.Option("fp16", "--kv-precision", help="KV cache precision: fp16 or int8. int8 sizes memory and predictions only: `edgekit build` makes FP16 KV caches, so such a plan cannot be written with -o."),
    power_mode: Optional[str] = typer.Option(None, "--power-mode", help="Power mode to headline (all modes are predicted)."),
    targets_dir: Optional[Path] = typer.Option(None, "--targets-dir", help=TARGETS_DIR_HELP),
    no_tiles: bool = typer.Option(False, "--no-tiles", help="Skip the tile solver (no compiles; no shared-memory figures)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Also write the plan as JSON to this file: `edgekit build --plan FILE` executes it."),
    json_out: bool = typer.Option(False, "--json", help="Print the plan as JSON instead of tables."),
) -> None:
    """Plan a model for a target: tiles that fit shared memory (compiled for the target's arch), precision,
    static-shape buckets, memory map and roofline predictions per power mode. Refuses a plan that does not fit,
    and says what would."""
    from edgekit.model.loader import load_model
    from edgekit.plan.buckets import parse_bucket_list
    from edgekit.plan.planner import make_plan
    from edgekit.plan.targets import load_target

    from edgekit.output_path import check_output_path

    precision = cli_precision(precision, BUILD_PRECISIONS)
    from edgekit.plan.planner import KV_PRECISIONS

    if kv_precision not in KV_PRECISIONS:
        raise typer.BadParameter(f"{kv_precision!r}: expected one of {', '.join(KV_PRECISIONS)}",
                                 param_hint="--kv-precision")
    if output is not None and kv_precision != "fp16":
        raise typer.BadParameter(f"--kv-precision {kv_precision} is for sizing only: `edgekit build` makes FP16 KV "
                                 "caches, so it could not carry out this plan; drop -o, or --kv-precision",
                                 param_hint="--output")
    if output is not None and no_tiles:
        raise typer.BadParameter("a written plan is what `edgekit build --plan` executes, and it needs the tiles; "
                                 "drop --no-tiles", param_hint="--output")
    if output is not None:
        check_output_path(output, "-o", kind="file")
    tg = load_target(target, targets_dir)
    m = load_model(model, weights=False, tokenizer=False)
    given = parse_bucket_list(buckets) if buckets is not None else None  # '' is refused, not the default
    model_info = {"name": m.config.name, "source": m.source.to_dict(), "config": m.config.to_dict()}
    planned = _lossless_int4_plan(m, kv_precision) if precision == "int4" else None
    from contextlib import nullcontext

    from edgekit.quant.progress import LineProgress

    # a spinner on a terminal; elsewhere (CI, nohup) one line per kernel solved (the long part), with the time
    lines = None if err_console.is_terminal else LineProgress(err_console)
    title = f"planning {m.config.name} for {tg.name} ({tg.arch})..."
    with (err_console.status(title) if lines is None else nullcontext()) as status:
        p = make_plan(
            m.config, tg, model_info=model_info, context=context, batch=batch, precision=planned or precision,
            kv_precision=kv_precision,
            trace=trace, buckets=given, max_buckets=max_buckets, power_mode=power_mode, solve_tiles=not no_tiles,
            progress=(lambda msg: lines.note(f"{tg.name}: {msg}")) if lines is not None else (
                lambda msg: status.update(f"{tg.name}: {msg}")),
        )
    d = p.to_dict()
    if output:
        write_json_file(output, d)
    if json_out:
        from edgekit.plan.anchors import anchors_beside

        print_json({**d, "published_beside_prediction": anchors_beside(d)})  # not part of the plan file
        return
    print_plan(d)
    if output:
        console.print(f"[dim]plan written to {output}[/]")


def _lossless_int4_plan(m, kv_precision: str):
    """An INT4 plan with the group layout a GGUF's 4-bit projections will keep (group 32), or None (the calibrated
    default, group 128)."""
    if m.source.kind != "gguf":
        return None
    from pathlib import Path

    from edgekit.model.gguf_loader import projection_tensor_types
    from edgekit.model.gguf_types import lossless_int4_layout
    from edgekit.plan.precision import PrecisionPlan

    types = projection_tensor_types(Path(m.source.location))
    layout = lossless_int4_layout(types)
    if layout is None:
        return None
    pp = PrecisionPlan.uniform(m.config, "w4a16", kv_precision)
    pp.int4_group, pp.int4_group_bytes = layout  # the file's 4-bit blocks are taken in bit for bit
    return pp


_TILE_ABBREV = {"BLOCK_M": "M", "BLOCK_N": "N", "BLOCK_K": "K", "BLOCK_H": "H", "BLOCK_G": "Q", "BLOCK_F": "F",
                "HEAD_DIM": "D", "MAX_SPLITS": "S", "GROUP_M": "G"}


def _tile_label(constexprs: dict) -> str:
    """{'BLOCK_M': 128, 'BLOCK_N': 64, 'HEAD_DIM': 64} -> 'M128 N64 D64' (fixed flags such as W_INT8 left out)."""
    return " ".join(f"{_TILE_ABBREV[k]}{v}" for k, v in constexprs.items() if k in _TILE_ABBREV)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def print_plan(d: dict) -> None:
    """Tables for a plan dict (also used by the build summary)."""
    tg, mem, shapes = d["target"], d["memory"], d["shapes"]
    budget = tg["smem_budget_bytes"]
    console.print(
        f"[bold]{d['model']['name']}[/] on [bold]{tg['name']}[/] ({tg['arch']}, {tg['sms']} SMs, "
        f"smem budget {budget} B/block), precision {d['precision']['label']}, KV {d['precision']['kv_cache']}, "
        f"context {shapes['context']}, batch {shapes['batch']}"
    )

    if d["tiles"]:
        t = Table(title=f"Kernels and tiles: shared bytes read from kernels compiled for {tg['arch']} (budget {budget} B)")
        for col in ("kernel", "tile", "w/s", "smem B", "%", "est. B", "regs", "pick"):
            t.add_column(col, justify="left" if col in ("kernel", "tile", "picked") else "right", no_wrap=True)
        for c in d["tiles"]:
            picked = (f"1/{c['within_estimate']}" + (f" ({len(c['rejected'])} rej.)" if c["rejected"] else "")
                      if c["searched"] else "dflt")
            t.add_row(c["kernel"], _tile_label(c["constexprs"]), f"{c['num_warps']}/{c['num_stages']}",
                      str(c["shared_bytes"]), f"{100 * c['shared_bytes'] / budget:.0f}", str(c["estimated_shared_bytes"]),
                      "-" if c.get("registers") is None else str(c["registers"]), picked)
        console.print(t)
        console.print("[dim]tile: M/N/K/H/F block sizes, D head dim, Q query rows per KV head, S max KV splits, G GEMM "
                      "group; w/s warps/stages; %: of the budget; est.: the analytical estimate; pick: rank 1 of the "
                      "candidates within the estimate, rej.: compiled and rejected; dflt: default variant, not "
                      "searched.[/]")
    dec = d["decode"]
    console.print(f"decode attention: {dec['splits']} KV splits — {dec['rule']}; grid {dec['grid']}")
    path = dec.get("path")
    if path:  # plans written before the fused path was planned have none
        per_layer = (f" ({path['kernels_per_layer']} per layer + {path['kernels_outside_layers']} per token)"
                     if path.get("kernels_per_layer") is not None else "")
        console.print(f"decode path: [bold]{path['path']}[/], {path['kernels_per_token']} kernels per token{per_layer}, "
                      f"PREDICTED from the launch programs at {path['power_mode']}'s SMs — {path['reason']}")

    t = Table(title="Operators the bundle runs, and their precision")
    for col in ("operator", "paths", "weights", "activations", "accumulate", "output"):
        t.add_column(col, no_wrap=col == "operator")
    for o in d["operators"]:
        t.add_row(o["op"], ", ".join(o["paths"]), o["weights"], o["activations"], o["accumulate"], o["output"])
    console.print(t)

    b = d["buckets"]
    line = f"buckets {shapes['buckets']} ({b['method']})"
    if b.get("trace"):
        tr, uni = b["trace"], b["uniform"]
        chunked = (f" (+{tr['chunked']} past the largest bucket, prefilled in chunks)" if tr.get("chunked") else "")
        line += (f"; on {tr['source']} ({tr['requests']} requests): coverage {_pct(tr['coverage'])}{chunked}, padding "
                 f"waste {_pct(tr['waste'])} vs uniform {uni['buckets']}: waste {_pct(uni['waste'])}")
    console.print(line)

    t = Table(title=f"Memory map: {fmt_bytes(mem['total_bytes'])} (from shapes)")
    t.add_column("item")
    t.add_column("bytes", justify="right")
    t.add_column("share", justify="right")
    for k in ("weights", "kv_cache", "activations", "workspace", "runtime_reserve", "os_headroom"):
        t.add_row(k.replace("_", " "), fmt_bytes(mem[f"{k}_bytes"]), _pct(mem[f"{k}_bytes"] / mem["total_bytes"]))
    t.add_row("[bold]free[/]", fmt_bytes(mem["free_bytes"]), _pct(mem["free_bytes"] / mem["total_bytes"]))
    console.print(t)

    r0 = d["roofline"][0]
    t = Table(title="PREDICTED per power mode (roofline model, not measured)"
                    + (f"; decode with the {d['decode']['path']['path']} step's kernel count" if d["decode"].get("path") else ""))
    for col in ("mode", "W", "SMs@MHz", "GB/s", f"decode tok/s ctx {r0['decode_short']['kv_len']}",
                f"ctx {r0['decode_full']['kv_len']}", "bound only", "mJ/tok", f"prefill tok/s ({r0['prefill']['bucket']})"):
        t.add_column(col, justify="left" if col == "mode" else "right", no_wrap=col == "mode")
    for r in d["roofline"]:
        ds, df, pf = r["decode_short"], r["decode_full"], r["prefill"]
        t.add_row(
            r["power_mode"] + (" *" if r["power_mode"] == d["power_mode"] else ""), f"{r['power_budget_w']:g}",
            f"{r['active_sms']}@{r['gpu_clock_mhz']:g}", f"{r['dram_bandwidth_gbps']:g}",
            f"{ds['tokens_per_s']:.0f}", f"{df['tokens_per_s']:.0f}", f"{ds['roofline_tokens_per_s']:.0f}",
            f"{ds['energy_per_token_mj']:.1f}", f"{pf['tokens_per_s']:.0f} {pf['bound'][:3]}",
        )
    console.print(t)
    a = d["roofline_assumptions"]
    console.print(
        f"[dim]assumptions: {a['bandwidth_efficiency']:g} of peak bandwidth, {a['compute_efficiency']:g} of peak compute, "
        f"{a['kernel_overhead_us']:g} µs per kernel ('bound only' leaves it out); energy = {a['energy']}; "
        f"prefill: mem/com = memory- or compute-bound. * headline mode.[/]"
    )
    _print_anchors(d)
    for n in d.get("notes", []) + d["precision"].get("notes", []):
        console.print(f"[yellow]note:[/] {n}")


def _print_anchors(d: dict) -> None:
    """Published decode figures for a model of this shape on this target, beside this plan's prediction."""
    from edgekit.plan.anchors import anchors_beside

    for a in anchors_beside(d):
        console.print(
            f"published beside this prediction: {a['published_decode_tokens_per_s']:g} tok/s decode on {a['board']} "
            f"({a['setting']}; measured by others: {a['source']}); this plan PREDICTS "
            f"{a['predicted_decode_tokens_per_s']:.0f} tok/s at ctx {a['predicted_at_kv_len']} in "
            f"{a['predicted_power_mode']} ({d['precision']['label']}, roofline, not measured)",
            highlight=False)
