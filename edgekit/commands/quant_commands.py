"""`edgekit quantize` and `edgekit eval`: INT8 weights behind an accuracy gate, and measuring any model on any text."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from edgekit.cli import app
from edgekit.cli_common import cli_precision, console, err_console, fmt_bytes, head_embedding_line, note, print_json
from edgekit.measured_on import in_words, measured_on
from edgekit.precision_names import DEFAULT_PRECISION, QUANT_MODE, head_scheme, name_of_quant_mode
from edgekit.precision_names import help_text as precision_help

QUANT_PRECISIONS = ("int8", "w8a8", "int4")
DEFAULT_EVAL_WINDOW = 256  # tokens a perplexity window scores, where the model has that many positions
DEFAULT_EVAL_PROMPTS = 4  # greedy prompts the agreement check runs (passage openings of the text)
DEFAULT_EVAL_NEW_TOKENS = 128  # greedy tokens compared per prompt
MODEL_HELP = "A .gguf file, a Hugging Face model directory, preset:NAME (random weights), or omitted for the default model (SmolLM2-135M-Instruct)."


def _pct(x: float) -> str:
    return f"{100 * x:+.2f}%"


def _metrics_table(title: str, m: dict, gate: dict | None) -> Table:
    t = Table(title=title)
    for col in ("metric", "value", "threshold"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    t.add_row("perplexity (FP)", f"{m['fp_perplexity']:.3f}", "")
    t.add_row("perplexity (quantized)", f"{m['quant_perplexity']:.3f}", "")
    from edgekit.quant.judged_by import JUDGED_BY_KL

    judged = m.get("judged_increase", m["perplexity_increase"])
    if m.get("judged_by") != JUDGED_BY_KL:  # the text scored judged it (the held-out text, or eval's --text FILE)
        t.add_row("perplexity increase", _pct(m["perplexity_increase"]),
                  f"<= {_pct(gate['max_ppl_increase'])}" if gate else "")
    else:  # the FP model scores the text worse than a uniform guess: the bound holds the KL's increase
        t.add_row("perplexity increase (text, not judged)", _pct(m["perplexity_increase"]), "")
        t.add_row(f"perplexity increase on {m['judged_by']}", _pct(judged),
                  f"<= {_pct(gate['max_ppl_increase'])}" if gate else "")
    if m.get("greedy_agreement") is not None:
        t.add_row(f"greedy agreement ({m['greedy_positions']} positions)", f"{100 * m['greedy_agreement']:.1f}%",
                  f">= {100 * gate['min_greedy_agreement']:.1f}%" if gate else "")
    t.add_row("logits SNR", f"{m['logits_snr_db']:.1f} dB", f">= {gate['min_logits_snr_db']:.1f} dB" if gate else "")
    t.add_row("tokens scored", str(m["tokens_scored"]), "")
    return t


def _sensitivity_table(ranking: list[dict], top: int, fp_layers: list[str]) -> Table:
    t = Table(title=f"most sensitive layers (top {min(top, len(ranking))} of {len(ranking)}; quantized alone, rest FP)")
    for col in ("rank", "layer", "KL nats/token", "logits SNR", "kept FP"):
        t.add_column(col, justify="left" if col == "layer" else "right")
    for r in ranking[:top]:
        t.add_row(str(r["rank"]), r["layer"], f"{r['kl_nats']:.2e}", f"{r['logits_snr_db']:.1f} dB",
                  "yes" if r["layer"] in fp_layers else "")
    return t


def _print_report(report: dict, top: int) -> None:
    gate = report["gate"]
    status = "[green]passed[/]" if gate.get("passed") else "[red]FAILED[/]"
    console.print(_metrics_table(f"accuracy gate ({name_of_quant_mode(report['mode'])}{', INT8 KV' if report['kv_int8'] else ''}): {status} "
                                 f"({in_words(report['measured_on'])}, held-out text)", gate["metrics"], gate["config"]))
    for f in gate.get("failures", []):
        console.print(f"[red]- {f}[/]")
    if len(gate.get("attempts", [])) > 1:
        for a in gate["attempts"][1:]:
            m = a["metrics"]
            judged = m.get("judged_increase", m["perplexity_increase"])  # what the verdict held to its bound
            console.print(f"mixed precision, {len(a['fp_layers'])} layer(s) in FP: perplexity {_pct(judged)}, "
                          f"agreement {100 * (m['greedy_agreement'] or 0):.1f}%, SNR {m['logits_snr_db']:.1f} dB -> "
                          + ("[green]pass[/]" if not a["failures"] else "[red]fail[/]"))
    if "sensitivity" in report:
        console.print(_sensitivity_table(report["sensitivity"]["layers"], top, report.get("fp_layers", [])))
    if report.get("fp_layers"):
        console.print(f"kept in FP: {', '.join(report['fp_layers'])}")
    wb = report.get("weight_bytes", {})
    if wb:
        console.print(f"weights: {fmt_bytes(wb['quantized'])} stored (FP32 as loaded: {fmt_bytes(wb['fp32_as_loaded'])})")
    if report.get("head_embedding"):
        console.print(head_embedding_line(report["head_embedding"]))


@app.command()
def quantize(
    model: Optional[str] = typer.Argument(None, help=MODEL_HELP),
    precision: str = typer.Option(DEFAULT_PRECISION, "--precision", help=precision_help(QUANT_PRECISIONS)),
    mode: Optional[str] = typer.Option(None, "--mode", hidden=True, help="Old name of --precision (w8a16 = int8, w8a8)."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory for model.safetensors and report.json (created)."),
    kv_int8: bool = typer.Option(False, "--kv-int8", help="Also store the KV cache in INT8 (static per-head scales from calibration)."),
    alpha: Optional[float] = typer.Option(None, "--alpha", min=0.0, max=1.0, help="SmoothQuant migration strength, --precision w8a8 only (0: none, 1: all range moved to the weights). Default: 0.5."),
    allow_mixed: bool = typer.Option(False, "--allow-mixed", help="If the gate fails, keep the most sensitive layers in FP16 until it passes instead of stopping."),
    quantize_head: bool = typer.Option(False, "--quantize-head", help="Quantize the LM head too (when tied, the one quantized matrix is the embedding too)."),
    head_precision: Optional[str] = typer.Option(None, "--head-precision", help="int8 or int4 for the LM head (implies --quantize-head; default: --precision's, and a GGUF Q8_0 table kept bit for bit)."),
    max_ppl_increase: Optional[float] = typer.Option(None, "--max-ppl-increase", help="Gate: largest relative perplexity increase, e.g. 0.01 for +1% (default: 0.01 int8, 0.03 w8a8 and int4)."),
    min_agreement: Optional[float] = typer.Option(None, "--min-agreement", help="Gate: smallest greedy-token agreement, 0..1 (default: 0.95 int8, 0.90 w8a8 and int4)."),
    min_snr_db: Optional[float] = typer.Option(None, "--min-snr-db", help="Gate: smallest logits SNR in dB (default: 20 int8, 15 w8a8, 12 int4)."),
    ppl_tokens: Optional[int] = typer.Option(None, "--ppl-tokens", min=2, help="Held-out tokens scored for perplexity and SNR (default 2048)."),
    new_tokens: Optional[int] = typer.Option(None, "--new-tokens", min=2, help="Greedy tokens compared per prompt (default 128)."),
    rank: bool = typer.Option(False, "--rank", help="Rank layer sensitivity even if the gate passes (it is always ranked when it fails)."),
    top: int = typer.Option(10, "--top", min=1, help="Sensitive layers to show."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Recompute the gate's FP reference instead of reading it from the build cache (~/.cache/edgekit)."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Quantize a model's linear layers to INT8 or INT4, calibrated on edgekit's shipped text, and gate it on held-out
    text.

    Writes DIR/model.safetensors (int8 or packed int4 weights, their scales, smoothing factors, FP16 norms and
    embeddings; a tied head quantized with --quantize-head is the embedding too) and DIR/report.json. A failed gate
    writes only report.json and exits 2, naming the layers that hurt most.
    """
    from edgekit.cache import BuildCache
    from edgekit.model.loader import load_model
    from edgekit.model.weights_file import WEIGHTS_FILE
    from edgekit.quant.gate import GateConfig, GateFailedError
    from edgekit.quant.io import check_quantize_directory, write_quantized, write_report
    from edgekit.quant.progress import Steps, make_progress
    from edgekit.output_path import check_output_path
    from edgekit.quant.quantize import QuantizeOptions, quantize_model
    from edgekit.quant.source_check import check_source_model

    check_output_path(out, "-o", kind="dir")
    check_quantize_directory(out)
    if mode is not None:
        note("--mode is the old name of --precision; use --precision")
        precision = mode
    precision = cli_precision(precision, QUANT_PRECISIONS)
    mode = QUANT_MODE[precision]
    if alpha is not None and mode != "w8a8":  # only SmoothQuant reads it: it was dropped without a word (exit 0)
        raise typer.BadParameter(f"{alpha} is SmoothQuant's migration strength, which only --precision w8a8 uses "
                                 f"(this is {precision}): drop --alpha, or pass --precision w8a8", param_hint="--alpha")
    gate = GateConfig.for_mode(mode, max_ppl_increase=max_ppl_increase, min_greedy_agreement=min_agreement,
                               min_logits_snr_db=min_snr_db, ppl_tokens=ppl_tokens, new_tokens=new_tokens)
    opts = QuantizeOptions(alpha=QuantizeOptions.alpha if alpha is None else alpha, quantize_head=quantize_head or head_precision is not None, always_rank=rank,
                           head_scheme=head_scheme(head_precision, precision))
    # a GGUF's 4-bit projections are taken in as they are, and with a quantized head (no --head-precision) a Q8_0
    # embedding/head table
    m = load_model(model, keep_int4=precision == "int4", keep_q8_0=opts.quantize_head and opts.head_scheme is None)
    check_source_model(m)  # a damaged file is named in seconds, before minutes of quantization blame the quantizer
    try:
        with make_progress() as progress:
            result = quantize_model(m, mode, kv_int8=kv_int8, gate=gate, allow_mixed=allow_mixed, options=opts,
                                    steps=Steps(progress), reference_cache=BuildCache(None, enabled=not no_cache))
    except GateFailedError as e:
        path, removed = write_report(out, e.report)
        if json_out:
            print_json(e.report)
        else:
            _print_report(e.report, top)
        err_console.print(f"report: {path} (no weights written" + (f"; the earlier run's {WEIGHTS_FILE} there was "
                                                                     "removed: it is not what this report describes)"
                                                                     if removed else ")"))
        raise
    paths = write_quantized(out, result)
    if json_out:
        print_json(result.report)
        return
    _print_report(result.report, top)
    console.print("wrote " + ", ".join(f"{p} ({fmt_bytes(p.stat().st_size)})" for p in paths))


def _report_gate_config(quantized: Path) -> dict | None:
    """The gate thresholds in DIR/report.json (None without one), checked to make a GateConfig: a damaged or
    hand-edited report is an error naming the file, not a traceback after the whole evaluation."""
    from edgekit.errors import QuantizationError
    from edgekit.quant.gate import GateConfig
    from edgekit.quant.io import REPORT_DAMAGED_HINT, REPORT_FILE, read_report

    path = Path(quantized) / REPORT_FILE
    if not path.is_file():
        return None
    gate = read_report(path).get("gate")
    cfg = gate.get("config") if isinstance(gate, dict) else None
    if not cfg:
        return None
    try:
        GateConfig(**cfg).validate()
    except (TypeError, ValueError, QuantizationError) as e:
        raise QuantizationError(f"{path}: gate.config is not a gate configuration ({e})",
                                hint=REPORT_DAMAGED_HINT) from e
    return cfg


@app.command(name="eval")
def eval_cmd(
    model: Optional[str] = typer.Argument(None, help=MODEL_HELP),
    text: Path = typer.Option(..., "--text", help="A UTF-8 text file to score."),
    quantized: Optional[Path] = typer.Option(None, "--quantized", help="A directory written by `edgekit quantize`: compare it with MODEL."),
    max_tokens: int = typer.Option(2048, "--max-tokens", min=2, help="Score at most this many tokens of the text."),
    window: Optional[int] = typer.Option(None, "--window", min=2, help="Tokens per window; each window is scored on its own (default: 256, or the model's positions where it has fewer)."),
    prompts: Optional[int] = typer.Option(None, "--prompts", min=0, help=f"Greedy prompts (passage openings) for the agreement check, with --quantized or --precision int4 (default {DEFAULT_EVAL_PROMPTS})."),
    new_tokens: Optional[int] = typer.Option(None, "--new-tokens", min=2, help=f"Greedy tokens compared per prompt, with --quantized or --precision int4 (default {DEFAULT_EVAL_NEW_TOKENS})."),
    precision: Optional[str] = typer.Option(
        None, "--precision", help=precision_help(("int4",), default=None) + " With int4 (and no --quantized): MODEL's 4-bit "
        "GGUF projections taken in losslessly, compared with MODEL dequantized to FP32."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Recompute MODEL's reference results instead of reading them from the build cache."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Perplexity of MODEL on a text file; with --quantized, also greedy agreement and logits SNR of the quantized model;
    with --precision int4, the same for MODEL's lossless INT4 intake.

    Runs on this machine's CPU with the reference operators (FP32 activations)."""
    from edgekit.errors import QuantizationError
    from edgekit.model.decoder import Decoder
    from edgekit.model.loader import load_model
    from edgekit.quant import corpus
    from edgekit.kernels.dispatch import DispatchTable
    from edgekit.cache import BuildCache
    from edgekit.quant.gate import EvalText, GateConfig, check, evaluate, perplexity
    from edgekit.quant.judged_by import text_file
    from edgekit.quant.reference_cache import cached_reference
    from edgekit.model.weights_file import load_weights_file
    from edgekit.quant.progress import Steps, make_progress

    if precision is not None:
        precision = cli_precision(precision, ("int4",))
        if quantized is not None:
            raise QuantizationError("--precision int4 compares MODEL's own INT4 intake; --quantized compares a directory",
                                    hint="pass one of them")
    if quantized is None and precision is None and (prompts is not None or new_tokens is not None):
        # perplexity alone runs no greedy prompts: taking the flag and doing nothing with it reads as a check that ran
        given = " and ".join(f for f, v in (("--prompts", prompts), ("--new-tokens", new_tokens)) if v is not None)
        raise QuantizationError(f"{given} set the greedy agreement check, which runs only against a quantized model; "
                                "without --quantized or --precision int4, eval measures perplexity alone",
                                hint=f"add --quantized DIR or --precision int4, or drop {given}")
    prompts = DEFAULT_EVAL_PROMPTS if prompts is None else prompts
    new_tokens = DEFAULT_EVAL_NEW_TOKENS if new_tokens is None else new_tokens
    gate_cfg = _report_gate_config(quantized) if quantized is not None else None  # before the work: it may be damaged
    m = load_model(model)
    from edgekit.plan.planner import within_positions

    window = within_positions(m.config, window, DEFAULT_EVAL_WINDOW, "--window", "--window", QuantizationError)
    body = corpus.read_text_file(text)
    ids = corpus.tokenize(body, m.tokenizer, m.config.vocab_size)
    windows = corpus.windows(ids, window, max_tokens)
    if precision == "int4":
        from edgekit.quant.int4_intake import compare_lossless_int4

        plist = corpus.prompts(body, m.tokenizer, m.config.vocab_size, prompts, 32)
        gate = GateConfig(new_tokens=new_tokens)
        with make_progress() as progress:
            res = compare_lossless_int4(m, load_model(model, tokenizer=False, keep_int4=True), EvalText(windows, plist), gate,
                                        Steps(progress), text_name=text_file(text))
        res.update(model=m.config.name, text=str(text), window_len=window)
        if json_out:
            print_json(res)
            return
        console.print(_metrics_table(f"lossless INT4 intake vs {m.config.name} dequantized, on {text} "
                                     f"({in_words(res['measured_on'])}, FP32)",
                                     res, None))
        greedy = ("not checked (--prompts 0)" if res["greedy_tokens_identical"] is None else
                  f"{res['greedy_tokens_identical']} ({res['greedy_tokens_same']}/{res['greedy_tokens_total']})")
        console.print(f"{res['w4a16_layers']} projections W4A16 (bit-exact from the file), {res['fp_layers']} in FP; "
                      f"free-running greedy tokens identical: {greedy}")
        return
    ops = DispatchTable()
    fp = Decoder(m.config, m.weights, ops)
    out: dict = {"model": m.config.name, "text": str(text), "measured_on": measured_on(fp.device), "window_len": window}
    with make_progress() as progress:
        steps = Steps(progress)
        if quantized is None:
            out.update(perplexity(fp, windows, steps=steps))
        else:
            q = load_weights_file(quantized)
            if q.config.to_dict() != m.config.to_dict():
                raise QuantizationError(
                    f"{quantized} was quantized from {q.config.name!r}, whose config differs from {m.config.name!r}",
                    hint="pass the same MODEL that `edgekit quantize` was given",
                )
            src = (q.header.get("source") or {}).get("sha256")
            if src and m.source.sha256 and src != m.source.sha256:
                err_console.print(f"[yellow]warning:[/] {quantized} was quantized from a file with sha256 {src[:12]}..., "
                                  f"MODEL has {m.source.sha256[:12]}...")
            plist = corpus.prompts(body, m.tokenizer, m.config.vocab_size, prompts, 32)
            ref, ref_cached = cached_reference(fp, EvalText(windows, plist), new_tokens, model_identity=m.source.content_identity(),
                                               cache=BuildCache(None, enabled=not no_cache), steps=steps)
            out["fp_reference"] = "read from the cache" if ref_cached else "computed"
            kv = q.kv_scales.roundtrip if q.kv_scales is not None else None
            metrics = evaluate(Decoder(q.config, q.weights, ops), ref, kv, steps, "quantized model",
                               text_name=text_file(text))  # the user's file, not edgekit's held-out text
            out.update(metrics)
            out["quantized"] = {"dir": str(quantized), "mode": q.header.get("mode"), "kv_int8": q.kv_scales is not None,
                                "fp_layers": [n for n, d in q.header["layers"].items() if d["op"] == "linear"]}
            if gate_cfg:
                out["gate_config"] = gate_cfg
                out["gate_failures"] = check(metrics, GateConfig(**gate_cfg))
    if json_out:
        print_json(out)
        return
    if quantized is None:
        console.print(f"perplexity {out['perplexity']:.3f} over {out['tokens_scored']} tokens of {text} "
                      f"(windows of {window}; {in_words(out['measured_on'])}, FP32)")
        return
    console.print(_metrics_table(f"{quantized} vs {m.config.name} on {text} ({in_words(out['measured_on'])})", out, out.get("gate_config")))
    if "gate_failures" in out:
        console.print("gate thresholds from report.json: " + ("[green]pass[/]" if not out["gate_failures"]
                                                               else "[red]fail[/]: " + "; ".join(out["gate_failures"])))
