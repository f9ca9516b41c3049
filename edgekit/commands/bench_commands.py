"""`edgekit bench`: edgekit's runtime against torch.compile and transformers, on this machine's GPU."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import List, Optional

import typer

from edgekit.cli import app
from edgekit.cli_common import cli_precision, console, err_console, note
from edgekit.seed_range import MAX_SEED
from edgekit.strict_json import write_json_file

DEFAULT_MODELS = ["preset:smollm2-135m", "preset:qwen2.5-1.5b"]


def _csv(text: str, kind, what: str, example: str) -> tuple:
    """--WHAT's comma list; ``example`` is a valid value of that option, for the hint."""
    from edgekit.errors import BenchmarkError

    items = [x.strip() for x in text.split(",") if x.strip()]
    try:
        return tuple(kind(x) for x in items)
    except ValueError as e:
        raise BenchmarkError(f"--{what}: cannot read {text!r} ({e})",
                             hint=f"give a comma-separated list, e.g. --{what} {example}") from e


def _bench_precisions(text: str, quantize_head: bool) -> tuple[str, ...]:
    """--precision in the one vocabulary; the old `int8-head` item becomes --quantize-head (with a note)."""
    chosen = []
    for item in _csv(text, str, "precision", "fp16,int8"):
        if item == "int8-head":
            note("--precision int8-head is the old spelling of --precision int8 --quantize-head")
            quantize_head = True
            continue
        chosen.append(cli_precision(item, ("fp16", "int8", "int4")))
    if quantize_head:  # the head quantized like the blocks: int8 -> int8-head, int4 -> int4-head
        chosen += [f"{p}-head" for p in ("int8", "int4") if p in chosen] or ["int8-head"]
    return tuple(dict.fromkeys(chosen))


def _sms(text: Optional[str]) -> tuple[int, ...]:
    """--sms: distinct positive SM counts, in the order given (the device's own count is checked on the device)."""
    from edgekit.errors import BenchmarkError

    if text is None:
        return ()
    counts = _csv(text, int, "sms", "8,16")
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise BenchmarkError(f"--sms takes distinct positive SM counts, got {text!r}",
                             hint="e.g. --sms 8,16 (an Orin has 16 SMs, 8 in its 30 W mode)")
    return counts


def _refuse_bundle(spec: str) -> None:
    from edgekit.errors import BenchmarkError

    p = Path(spec).expanduser()
    if p.is_dir() and (p / "manifest.json").exists():
        raise BenchmarkError(
            f"{spec} is a bundle; benchmarking a bundle needs the bundle runtime, which edgekit does not have yet",
            hint="pass the model it was built from instead (a .gguf file, a Hugging Face directory or preset:NAME)",
        )


@app.command()
def bench(
    models: Optional[List[str]] = typer.Argument(
        None, metavar="MODEL",
        help="Models to measure: a .gguf file, a Hugging Face directory or preset:NAME (random weights). "
             "Default: preset:smollm2-135m (the default model's shape) and preset:qwen2.5-1.5b. Bundles are not accepted yet."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the full results here (rewritten after every step, atomically)."),
    contexts: str = typer.Option("128,512,2048", "--contexts", help="Prompt lengths to measure, comma-separated."),
    new_tokens: int = typer.Option(64, "--new-tokens", "-n", min=1, help="Tokens decoded after the first one, per timed loop."),
    hf_new_tokens: int = typer.Option(16, "--hf-new-tokens", min=1, help="Tokens decoded by transformers' eager generate (it runs ~20 tok/s)."),
    precision: str = typer.Option("fp16,int8", "--precision", help="Comma-separated: fp16, int8 (W8A16 block linears, FP16 LM head), int4 (W4A16 block linears, "
                                        "round-to-nearest for speed, FP16 LM head)."),
    quantize_head: bool = typer.Option(False, "--quantize-head", help="Also measure each quantized precision with the LM head quantized too (rows labelled int8-head, int4-head)."),
    baselines: str = typer.Option("compile,hf-eager,hf-compile", "--baselines",
                                  help="compile (edgekit reference + torch.compile), hf-eager, hf-compile (static cache + compile), "
                                       "llama.cpp (llama-bench on the same GGUF file; needs --llama-bench), or none."),
    llama_bench: Optional[str] = typer.Option(None, "--llama-bench", help="llama.cpp's llama-bench binary (a path or a command on PATH), for --baselines llama.cpp."),
    llama_quantize: Optional[str] = typer.Option(None, "--llama-quantize", help="llama.cpp's llama-quantize: also measure llama.cpp on Q8_0 and Q4_K_M copies of a preset's F16 GGUF."),
    gguf_dir: Optional[Path] = typer.Option(None, "--gguf-dir", help="Keep the GGUF files written for presets here (default: a temporary folder, removed after the run)."),
    fused: bool = typer.Option(True, "--fused/--no-fused", help="Also measure edgekit's fused decode path (rows edgekit-fused), the one `edgekit run` takes."),
    sms: Optional[str] = typer.Option(None, "--sms",
                                      help="Also run the fused decode confined to each of these SM counts with a CUDA green context "
                                           "(comma-separated, e.g. 8,16: an Orin's 16 SMs and its 30 W mode's 8): rows edgekit-fused-sms, "
                                           "against the copy bandwidth measured in the same partition, with the orin plan's tiles and "
                                           "alternatives. Without green contexts the rows say why and what ran instead."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Timed repeats per figure (the median is reported)."),
    check_tokens: Optional[int] = typer.Option(None, "--check-tokens", min=1,
                                               help="Greedy tokens compared with the torch reference path [default: 8, at most the tokens generated]."),
    seed: int = typer.Option(0, "--seed", min=0, max=MAX_SEED, help="Seed of the random preset weights and prompts."),
    energy: bool = typer.Option(True, "--energy/--no-energy", help="Energy per token from the NVML energy counter."),
    prefill_graph: bool = typer.Option(True, "--prefill-graph/--no-prefill-graph", help="Also time edgekit's prefill replayed as a CUDA graph."),
    profile: bool = typer.Option(True, "--profile/--no-profile", help="Profile edgekit's decode step: kernels per token, time inside vs between kernels."),
    time_budget_s: Optional[float] = typer.Option(None, "--time-budget-s", min=1, help="Skip (and record as skipped) work that would start later than this."),
    device: str = typer.Option("cuda", "--device", hidden=True, help="cuda; cpu only exercises the plumbing."),
) -> None:
    """Decode and prefill speed, time to first token, peak memory and energy per token, against the baselines.

    Everything runs in one process on this machine's GPU: edgekit's runtime (Triton kernels, CUDA-graph
    replay), edgekit's reference model under torch.compile(mode="reduce-overhead") (the gpt-fast recipe),
    transformers' eager generate and transformers' static cache + compile, on the same weights and prompts.
    With --baselines llama.cpp, llama-bench runs last on the same GGUF file edgekit loaded (for a preset, the
    random-weight F16 file edgekit writes, and llama-quantize's Q8_0 / Q4_K_M copies): decode at depth = context,
    batch 1, prefill of context tokens; ratios pair F16 with fp16 and Q8_0 with int8.
    Each configuration's greedy tokens are checked against the torch reference path. Prints tables
    (ratios and the speed goals included) and, with --json, writes every number.
    """
    from edgekit.bench.report import print_report
    from edgekit.bench.runner import BenchRun, BenchSettings
    from edgekit.output_path import check_output_path

    if json_path is not None:
        check_output_path(json_path, "--json", kind="file")
    specs = list(models) if models else list(DEFAULT_MODELS)
    for spec in specs:
        _refuse_bundle(spec)
    chosen = () if baselines.strip() == "none" else _csv(baselines, str, "baselines", "compile,hf-eager")
    sm_counts = _sms(sms)
    if sm_counts and device != "cuda":
        note(f"--sms on a {device} run: SM partitions need a CUDA GPU, so their rows are recorded as skipped, with the reason")
    settings = BenchSettings(
        models=specs, precisions=_bench_precisions(precision, quantize_head), contexts=_csv(contexts, int, "contexts", "512,4096"),
        new_tokens=new_tokens, hf_new_tokens=hf_new_tokens, repeats=repeats, baselines=chosen,
        check_tokens=check_tokens or min(8, min(new_tokens, hf_new_tokens) + 1), seed=seed, energy=energy, prefill_graph=prefill_graph, profile=profile,
        time_budget_s=time_budget_s, device=device, llama_bench=llama_bench, llama_quantize=llama_quantize,
        gguf_dir=str(gguf_dir) if gguf_dir else None, fused=fused, sms=sm_counts,
    )

    def write(doc) -> None:
        if json_path is not None:
            write_json_file(json_path, doc.to_json_dict())

    run = BenchRun(settings, log=lambda msg: err_console.print(f"[dim]{msg}[/]", highlight=False),
                   on_update=write, command=" ".join(shlex.quote(a) for a in ["edgekit", *sys.argv[1:]]))
    doc = run.run()
    # a log file or a remote run is not a terminal: rich would wrap the wide table at 80 columns
    print_report(doc, console)
    if json_path is not None:
        err_console.print(f"wrote {json_path}")
    from edgekit.bench.document import EDGEKIT_ENGINES, PARTITION_ENGINE

    if any(r.engine in (*EDGEKIT_ENGINES, PARTITION_ENGINE) and r.tokens_match is False for r in doc.rows):
        err_console.print("[bold red]edgekit's runtime disagrees with the reference path (see TOKEN MISMATCH above)[/]")
        raise typer.Exit(1)
