"""CLI commands for the build area: `edgekit keys generate`, `edgekit verify` (and `edgekit build`).

Registered on edgekit.cli.app when imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from edgekit.cli import app
from edgekit.cli_common import cli_precision, console, gate_line, head_embedding_line, print_json
from edgekit.precision_names import BUILD_PRECISIONS, DEFAULT_PRECISION, head_scheme
from edgekit.precision_names import help_text as precision_help
from edgekit.errors import BundleError
from edgekit.measured_on import CPU, in_words, measured_on

# ---------------------------------------------------------------------------- keys

keys_app = typer.Typer(help="Ed25519 signing keys for bundles and plugin packages.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


@keys_app.command("generate")
def keys_generate(
    directory: Path = typer.Argument(..., help="Directory to write edgekit.key (private, mode 0600) and edgekit.pub into."),
    force: bool = typer.Option(False, "--force", help="Replace an existing key pair (old signatures will no longer verify with the new key)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON (paths and key id)."),
) -> None:
    """Make a signing key pair: sign with DIR/edgekit.key (`build --key`), trust DIR/edgekit.pub (`verify --trust`)."""
    from edgekit.bundle.keys import generate_keypair, key_id, load_public_key
    from edgekit.output_path import check_output_path

    check_output_path(directory, "DIR", kind="dir")
    key_path, pub_path = generate_keypair(directory, force=force)
    kid = key_id(load_public_key(pub_path))
    if json_out:
        print_json({"private_key": str(key_path), "public_key": str(pub_path), "key_id": kid})
        return
    console.print(f"private key  {key_path}  (mode 0600: keep it secret, keep it off devices)")
    console.print(f"public key   {pub_path}  (copy to devices and CI: `edgekit verify --trust {pub_path}`)")
    console.print(f"key id       {kid}")


# ---------------------------------------------------------------------------- build

def stage_labels(precision: str | None) -> dict[str, str]:
    """What each build stage does, as the progress display names it (the quantize stage names its precision; a
    --plan build learns it from the plan)."""
    return {
        "load": "load the model", "target": "read the target profile",
        "plan": "plan (tiles compiled for the target)",
        "quantize": f"quantize to {precision.upper()} (accuracy gate)" if precision else "quantize (accuracy gate)",
        "compile": "cross-compile every operator",
        "golden": "golden vectors (FP64 reference)", "write": "write weights, tokenizer, plugins", "onnx": "export ONNX",
        "sign": "manifest + ed25519 signature", "archive": "single-file archive",
    }


def default_bundle_dir(model: str | None, target: str, precision: str | None) -> Path:
    """bundles/<model>-<target>-<precision>: the model's own name (a file's stem, a folder's or preset's name), never
    its path with the slashes replaced (without a precision, which a --plan build reads from the plan, no suffix)."""
    if model is None or model in ("", "default"):
        name = "smollm2-135m-instruct"
    elif model.startswith("preset:"):
        name = model.removeprefix("preset:")
    else:
        path = Path(model.rstrip("/\\"))
        name = path.stem if path.suffix.lower() == ".gguf" else path.name
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in name.lower()).strip("-.") or "model"
    return Path("bundles") / ("-".join(filter(None, (name, target, precision))))


@app.command()
def build(
    model: Optional[str] = typer.Argument(None, help="A .gguf file, a Hugging Face directory, preset:NAME, or omitted for the default model."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Target profile (see `edgekit targets`), e.g. orin. Required unless --plan gives it."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Bundle directory to write (default: bundles/<model>-<target>-<precision>)."),
    key: Optional[Path] = typer.Option(None, "--key", help="Ed25519 private key to sign with (make one: `edgekit keys generate DIR`)."),
    dev_key: bool = typer.Option(False, "--dev-key", help="Sign with the public development key (local testing only; recorded in the manifest, refused by devices by default)."),
    precision: Optional[str] = typer.Option(None, "--precision", help=precision_help(BUILD_PRECISIONS)),
    allow_mixed: bool = typer.Option(False, "--allow-mixed", help="If the accuracy gate fails, keep the most sensitive layers in FP16 instead of stopping."),
    quantize_head: bool = typer.Option(False, "--quantize-head", help="Quantize the LM head too, behind the same accuracy gate (when tied, the one quantized matrix is the embedding too: no FP16 copy is kept)."),
    head_precision: Optional[str] = typer.Option(None, "--head-precision", help="With --quantize-head: int8 or int4 for the LM head (default: --precision's, and a GGUF Q8_0 table is kept bit for bit as grouped INT8); an int4 model may keep an int8 head; int8 re-quantizes a Q8_0 table per row, the form the fused decode head takes."),
    context: Optional[int] = typer.Option(None, "--context", min=16, help="KV cache length in tokens (prompt + answer; at least 16). Default: 2048, or less if the model has fewer positions."),
    batch: Optional[int] = typer.Option(None, "--batch", min=1, help="The most sequences the device decodes together (default 1; serve runs batch buckets 1, 2, 4, ... up to it)."),
    plan_file: Optional[Path] = typer.Option(None, "--plan", help="Execute this plan (`edgekit plan -o FILE`) as written: its target, precision, shapes and tiles; refused, saying why, if it was made for another model or target."),
    buckets: Optional[str] = typer.Option(None, "--buckets", help="Comma-separated prompt buckets, e.g. 64,256,1024."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="JSONL trace of request lengths to choose buckets from."),
    archive: bool = typer.Option(False, "--archive", help="Also write the bundle as a single .tar file."),
    tensorrt_onnx: bool = typer.Option(False, "--tensorrt-onnx", help="Also write a TensorRT-flavoured ONNX (no function bodies, plugin attributes)."),
    no_onnx: bool = typer.Option(False, "--no-onnx", help="Skip the ONNX export."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not use the content-addressed build cache "
                                  "(~/.cache/edgekit, or EDGEKIT_CACHE_DIR). After a build its least recently "
                                  "used entries go until it fits EDGEKIT_CACHE_MAX_GB (GiB, default 5)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing bundle directory."),
    targets_dir: Optional[Path] = typer.Option(None, "--targets-dir", help="Extra directory of target YAML files."),
    json_out: bool = typer.Option(False, "--json", help="Print the build summary as JSON (progress goes to stderr)."),
) -> None:
    """Build a signed bundle for a target on this machine (no Jetson or GPU needed): load -> plan -> quantize ->
    cross-compile every operator -> golden vectors -> ONNX -> manifest + signature."""
    from edgekit.builder import BuildOptions, build_bundle
    from edgekit.cli_common import err_console
    from edgekit.plan.buckets import parse_bucket_list
    from edgekit.quant.progress import Steps, make_progress

    if plan_file is None and target is None:
        raise typer.BadParameter("a target is required (or --plan FILE, which names one)", param_hint="--target")
    if tensorrt_onnx and no_onnx:  # the TensorRT copy is made by the ONNX export: it was dropped without a word
        raise typer.BadParameter("a TensorRT-flavoured ONNX is written by the ONNX export, which --no-onnx skips; "
                                 "drop one of them", param_hint="--tensorrt-onnx")
    if precision is not None or plan_file is None:
        precision = cli_precision(precision or DEFAULT_PRECISION, BUILD_PRECISIONS)
    if key is None and not dev_key:
        raise BundleError("no signing key: a bundle must be signed", hint=_missing_key_hint())
    # checked here, before the model loads and the kernels compile (a build's minutes), as plan checks it: '64,16'
    # or '0,64' failed only after that, and '' (an unset shell variable) silently built the default buckets
    bucket_list = None if buckets is None else parse_bucket_list(buckets, example="64,256,1024")
    if out is None:
        out = default_bundle_dir(model, target or "plan", precision)
    opts = BuildOptions(model=model, target=target, out=out, key=key, dev_key=dev_key, precision=precision, context=context, quantize_head=quantize_head or head_precision is not None,
                        head_scheme=head_scheme(head_precision, precision or DEFAULT_PRECISION),
                        batch=batch, plan=plan_file,
                        buckets=bucket_list, trace=trace, allow_mixed=allow_mixed, archive=archive,
                        tensorrt_onnx=tensorrt_onnx, onnx=not no_onnx, force=force, targets_dir=targets_dir, use_cache=not no_cache)
    labels = stage_labels(precision)
    with make_progress(err_console) as progress:
        tasks: dict[str, int] = {}

        def report(stage: str, state: str) -> None:
            if state == "start":
                tasks[stage] = progress.add_task(labels.get(stage, stage), total=1)
            else:
                progress.update(tasks[stage], completed=1)

        result = build_bundle(opts, report, steps=Steps(progress))
    s = result.summary
    if json_out:
        print_json(s)
        return
    _print_build_summary(s)


def _missing_key_hint() -> str:
    """Point at a key that already exists before suggesting to make one."""
    from edgekit.bundle.keys import PRIVATE_KEY_FILE

    found = sorted({p for p in (Path("keys") / PRIVATE_KEY_FILE, Path(PRIVATE_KEY_FILE)) if p.is_file()})
    if found:
        return f"pass --key {found[0]} (found here); or --dev-key for a local test build devices refuse by default"
    return ("make one with `edgekit keys generate keys/` and pass --key keys/edgekit.key; "
            "or --dev-key for a local test build devices refuse by default")


def _print_build_summary(s: dict) -> None:
    from edgekit.cli_common import fmt_bytes

    t = Table(title=f"operators compiled for {s['target']['arch']} ({s['target']['name']}); shared memory read from the compiled kernels")
    for col in ("op", "kernel", "tile", "warps/stages", "shared bytes", "budget", "registers"):
        t.add_column(col)
    for o in s["operators"]:
        tile = ",".join(f"{k}={v}" for k, v in o["constexprs"].items())
        t.add_row(o["op"], o["kernel"], tile, f"{o['num_warps']}/{o['num_stages']}", str(o["shared_bytes"]),
                  str(o["budget_bytes"]), str(o["registers"] if o["registers"] is not None else "-"))
    console.print(t)
    console.print("precision: " + "; ".join(f"{k}: {v}" for k, v in s["precision"].items()))
    console.print(f"buckets: {s['buckets']} (KV cache {s['context']} tokens)")
    mem = s["memory"]
    console.print(
        f"memory plan (predicted, {mem['target']}): weights {fmt_bytes(mem['weights_bytes'])} + KV cache {fmt_bytes(mem['kv_cache_bytes'])}"
        f" + activations {fmt_bytes(mem['activations_bytes'])} + workspace {fmt_bytes(mem['workspace_bytes'])}"
        f" + OS headroom {fmt_bytes(mem['os_headroom_bytes'])} + runtime {fmt_bytes(mem['runtime_reserve_bytes'])};"
        f" {fmt_bytes(mem['free_bytes'])} free of {fmt_bytes(mem['total_bytes'])}")
    if s.get("quantization"):
        q = s["quantization"]
        console.print(f"quantization: {q['mode']}{' (cached)' if q['cached'] else ''}; "
                      + (gate_line(q["gate"], q.get("measured_on") or CPU) if q.get("gate") else "no accuracy gate"), highlight=False)
        if q.get("head_embedding"):
            console.print(head_embedding_line(q["head_embedding"]))
    for r in s["predictions"]:
        d, p = r["decode_short"], r["prefill"]
        console.print(f"predicted (roofline, not measured) on {s['target']['name']} [{r['power_mode']}]: decode "
                      f"{d['tokens_per_s']:.0f} tok/s at {d['kv_len']} ctx ({d['energy_per_token_mj']:.0f} mJ/token), "
                      f"prefill {p['tokens_per_s']:.0f} tok/s at {p['bucket']} tokens" if "tokens_per_s" in p else "")
    parts = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in sorted(s["bundle_bytes_by_part"].items()))
    console.print(f"bundle {s['bundle']}: {fmt_bytes(s['bundle_bytes'])} ({parts})")
    console.print("stages (s, measured on this CPU): " + ", ".join(f"{k} {v:.1f}" for k, v in s["stage_seconds"].items())
                  + f"; total {s['build_seconds']:.1f} s")
    pruned = s["cache"].get("pruned") or {}
    if pruned.get("removed"):
        console.print(f"build cache: removed {pruned['removed']} least recently used entries "
                      f"({fmt_bytes(pruned['freed_bytes'])}) to fit {fmt_bytes(pruned['limit_bytes'])} "
                      "(EDGEKIT_CACHE_MAX_GB)")
    if s["signed_with_dev_key"]:
        console.print("[yellow]signed with the public development key: devices refuse it unless told --allow-dev-key[/]")
    if not s["has_tokenizer"] and not s["model"]["name"].startswith("preset:"):
        console.print(f"[yellow]no tokenizer: {s['model']['name']} had no tokenizer.json, so the bundle has none; "
                      "`edgekit run` feeds a prompt's UTF-8 bytes as token ids and prints token ids, `edgekit serve` "
                      "refuses text. Add the model's tokenizer.json to its folder and build again[/]")


# ---------------------------------------------------------------------------- verify

_STATUS_STYLE = {"pass": "green", "fail": "bold red", "warn": "yellow", "skip": "dim"}


@app.command()
def verify(
    bundle: Path = typer.Argument(..., help="A bundle directory or its single-file .tar archive."),
    trust: Optional[List[Path]] = typer.Option(
        None, "--trust", help="A trusted public key (edgekit.pub, or a directory holding one). Repeat for several keys."
    ),
    allow_dev_key: bool = typer.Option(False, "--allow-dev-key", help="Accept a bundle signed with the public development key (local testing only)."),
    skip_golden: bool = typer.Option(False, "--skip-golden", help="Do not run the golden vectors (signature, hashes and schemas only)."),
    backend: str = typer.Option(
        "auto", "--golden-backend", help="Where golden vectors run: cpu (torch reference), gpu (the plugins' own kernels), auto (gpu if CUDA is available)."
    ),
    show_all: bool = typer.Option(False, "--all", help="List every passing file and golden-vector check instead of summarizing them."),
    json_out: bool = typer.Option(False, "--json", help="Print the full report as JSON."),
) -> None:
    """Check a bundle: signature by a trusted key, every file's sha256 and size, schemas, format version,
    target arch vs this machine, and the golden vectors (the plugins themselves on a GPU, the torch reference on a CPU).
    Exits non-zero on any failure."""
    from edgekit.bundle.golden import run_reference
    from edgekit.bundle.verify import verify_bundle

    keys = _trusted_keys(bundle, trust, allow_dev_key, "is only accepted")
    if backend not in ("auto", "cpu", "gpu"):
        raise BundleError(f"--golden-backend {backend!r} is not one of auto, cpu, gpu")
    if skip_golden and backend != "auto":  # it was dropped without a word: 'gpu' passed on a machine without one
        raise typer.BadParameter(f"{backend} names where golden vectors run, and --skip-golden runs none: drop one "
                                 "of them", param_hint="--golden-backend")
    run = None if skip_golden else run_reference
    runner_for_root = None
    if not skip_golden and backend != "cpu":
        import torch

        if torch.cuda.is_available():
            from edgekit.runtime.gpu_runner import plugin_runner

            runner_for_root = plugin_runner
        elif backend == "gpu":
            raise BundleError("--golden-backend gpu needs a CUDA GPU; none is available here", hint="use --golden-backend cpu")
    kwargs = dict(allow_dev_key=allow_dev_key, run_golden=run, runner_for_root=runner_for_root)
    # what a golden "pass" and its errors were measured with: on a CPU the plugins' kernels never ran, only the
    # torch reference operators did (the JSON and the piped table did not say which)
    golden = ({"ran": "plugin kernels", "measured_on": measured_on("cuda")} if runner_for_root else
              {"ran": "torch reference operators (the plugins' kernels need a GPU)", "measured_on": CPU})

    def golden_ran(report) -> dict:  # none ran where golden vectors were off or an earlier check stopped them
        ran = any(c.check == "golden" and c.status in ("pass", "fail") for c in report.checks)
        return golden if ran else {"ran": None, "measured_on": None}

    if json_out:
        report = verify_bundle(bundle, keys, **kwargs)
        print_json({**report.to_dict(), "golden_vectors": golden_ran(report)})
    else:
        where = f"the {golden['ran']}" if run else "no golden vectors"  # runner_for_root is set only where run is
        with console.status(f"verifying {bundle} (golden vectors: {where}) ..."):
            report = verify_bundle(bundle, keys, **kwargs)
        _print_report(report, show_all)
        if golden_ran(report)["ran"] is not None:
            console.print(f"golden vectors: run on the {golden['ran']}, {in_words(golden['measured_on'])}",
                          highlight=False)
    report.raise_if_failed()


def _print_report(report, show_all: bool) -> None:
    m = report.manifest
    title = f"{report.bundle}"
    if m is not None:
        title += f"  [{m.model.name} for {m.target.name} ({m.target.arch_name}), {len(m.plugins)} plugins, {len(m.files)} files]"
    t = Table(title=title, title_justify="left")
    t.add_column("check")
    t.add_column("file", overflow="fold")
    t.add_column("status")
    t.add_column("reason", overflow="fold")
    # Passing file and golden checks are summarized (one row for the files, one per golden file); --all lists each.
    passed_files = [c for c in report.checks if c.check == "file" and c.status == "pass"]
    golden_cases: dict[str, int] = {}
    for c in report.checks:
        if c.check == "golden" and c.status == "pass":
            golden_cases[c.file.split("#")[0]] = golden_cases.get(c.file.split("#")[0], 0) + 1
    shown: set[str] = set()
    for c in report.checks:
        if c.status == "pass" and not show_all and c.check in ("file", "golden"):
            key = "files" if c.check == "file" else c.file.split("#")[0]
            if key in shown:
                continue
            shown.add(key)
            if c.check == "file":
                t.add_row("file", f"{len(passed_files)} files", f"[{_STATUS_STYLE['pass']}]pass[/]",
                          "sha256 and size match the signed manifest (--all lists them)")
            else:
                t.add_row("golden", key, f"[{_STATUS_STYLE['pass']}]pass[/]",
                          f"{golden_cases[key]} case(s) within tolerance (--all shows each case's max error)")
            continue
        t.add_row(c.check, c.file, f"[{_STATUS_STYLE[c.status]}]{c.status}[/]", c.reason)
    console.print(t)
    n_fail = len(report.failures)
    if n_fail:
        console.print(f"[bold red]REFUSED[/]: {n_fail} check(s) failed")
    else:
        warns = sum(c.status == "warn" for c in report.checks)
        console.print("[green]OK[/]: bundle verified" + (f" ({warns} warning(s))" if warns else ""))


# ---------------------------------------------------------------------------- run


DECODE_PATH_HELP = ("Graphed decode path to try first: fused or per-operator (one that cannot run falls back "
                    "and says why: --json for run, /v1/models and /metrics for serve).")


def _trusted_keys(bundle: Path, trust: Optional[List[Path]], allow_dev_key: bool, verb: str) -> list:
    """The public keys of --trust, for verify / run / serve. A bundle path that does not exist is refused first: a
    typo was told to pass --trust, and only then that there is no such bundle."""
    from edgekit.bundle.keys import load_public_key
    from edgekit.bundle.verify import require_bundle_path

    require_bundle_path(bundle)
    keys = [load_public_key(p) for p in (trust or [])]
    if not keys and not allow_dev_key:
        raise BundleError(f"no trusted key given: a bundle {verb} if it is signed by a key you trust",
                          hint="pass --trust DIR/edgekit.pub, the public half of the key that signed it")
    return keys


def _check_decode_path(value: str) -> None:
    """--decode-path of run and serve: one of the decode paths select_decode_path knows, else a usage error."""
    from edgekit.runtime.fused_decode import DECODE_PATHS

    if value not in DECODE_PATHS:
        raise typer.BadParameter(f"got {value!r}; expected one of: {', '.join(DECODE_PATHS)}", param_hint="--decode-path")


@app.command()
def run(
    bundle: Path = typer.Argument(..., help="A bundle directory or .tar archive made by `edgekit build`."),
    prompt: str = typer.Option(..., "--prompt", "-p", help="The user message (or raw text with --raw)."),
    trust: Optional[List[Path]] = typer.Option(None, "--trust", help="A trusted public key (edgekit.pub). Repeat for several."),
    allow_dev_key: bool = typer.Option(False, "--allow-dev-key", help="Accept the public development key (local testing only)."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", "-n", min=1, help="Tokens to generate at most."),
    raw: bool = typer.Option(False, "--raw", help="Skip the chat template."),
    truncate: bool = typer.Option(False, "--truncate", help="Keep the last tokens of a prompt that is too long instead of failing."),
    skip_golden: bool = typer.Option(False, "--skip-golden", help="Verify signature and hashes only (skip the golden vectors)."),
    device: Optional[str] = typer.Option(None, "--device", help="cuda (or gpu) or cpu (default: cuda when available)."),
    cuda_graphs: bool = typer.Option(True, "--cuda-graphs/--no-cuda-graphs", help="Replay the decode step as a CUDA graph (GPU only)."),
    preferred_path: str = typer.Option("fused", "--decode-path", help=DECODE_PATH_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print the answer, tokens and timings as JSON."),
) -> None:
    """Verify a bundle, then generate with it: its plugins on a GPU, the torch reference on a CPU."""
    import sys

    _check_decode_path(preferred_path)

    from edgekit.cli_common import err_console
    from edgekit.generate import GenerationStats
    from edgekit.runtime.bundle_runtime import open_bundle, resolve_device
    from edgekit.runtime.run_generator import run_generator

    resolve_device(device)  # a GPU this machine lacks is refused before the bundle is read
    keys = _trusted_keys(bundle, trust, allow_dev_key, "runs only")
    b = open_bundle(bundle, keys, allow_dev_key=allow_dev_key, golden=not skip_golden, device=device)
    notes = list(b.notes)
    if b.tokenizer is not None:
        ids = b.tokenizer.encode(prompt) if raw or not b.tokenizer.chat_template else b.tokenizer.encode_chat(prompt)
    else:
        ids = [c % b.config.vocab_size for c in prompt.encode()]
        notes.append("this bundle has no tokenizer: the prompt went in as its UTF-8 bytes (as token ids) and the "
                     "answer is token ids; build from a model folder with tokenizer.json for text")
    setup = run_generator(b, ids, max_new_tokens, cuda_graphs=cuda_graphs, truncate=truncate,
                          prefer=preferred_path)
    gen, decode_path, prefill_path = setup.generator, setup.decode_path, setup.prefill_path
    stats = GenerationStats()
    out = list(gen.stream(ids, max_new_tokens, stop_ids=b.config.eos_token_ids, truncate=truncate, stats=stats))
    text = b.tokenizer.decode(out) if b.tokenizer is not None else " ".join(map(str, out))
    where = measured_on(b.device)
    if json_out:
        print_json({"text": text, "token_ids": out, "prompt_ids": ids, "backend": b.backend, "operators": gen.decoder.ops.sources(),
                    "decode_path": decode_path, "prefill_path": prefill_path, "stats": {**stats.to_dict(), "measured_on": where}, "notes": notes})
        return
    sys.stdout.write(text + "\n")
    err_console.print(f"[dim]{stats.prompt_summary()}, {stats.new_tokens} new; first token "
                      f"{stats.prefill_s * 1000:.0f} ms, {stats.decode_summary()}, {in_words(where)}; backend: {b.backend}[/]")
    for note in notes:
        err_console.print(f"[yellow]note:[/] {note}")


# ---------------------------------------------------------------------------- serve

@app.command()
def serve(
    bundle: Path = typer.Argument(..., help="A bundle directory or .tar archive made by `edgekit build`."),
    trust: Optional[List[Path]] = typer.Option(None, "--trust", help="A trusted public key (edgekit.pub); bundles and plugins must be signed by one. Repeat for several."),
    allow_dev_key: bool = typer.Option(False, "--allow-dev-key", help="Accept the public development key (local testing only)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (loopback by default; expose deliberately)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port (0: any free port)."),
    admin_token_file: Optional[Path] = typer.Option(None, "--admin-token-file", help="File (mode 0600) with the bearer token for the /v1/plugins admin routes (admin routes are off without it)."),
    store: Optional[Path] = typer.Option(None, "--store", help="Plugin store directory for over-the-air swaps (default: <bundle>.store)."),
    max_waiting: int = typer.Option(8, "--max-waiting", min=0, help="Requests that may wait for a decode row; more get HTTP 429 at once. A request is also refused at once when its expected wait is over --max-admission-wait-ms."),
    max_queue_wait_ms: float = typer.Option(350, "--max-queue-wait-ms", min=1, help="A request that waits longer than this for a decode row gets HTTP 429."),
    max_admission_wait_ms: float = typer.Option(50, "--max-admission-wait-ms", min=0, help="A request whose expected wait for a decode row (the measured step time x the tokens still to decode ahead of it) is over this gets HTTP 429 at once, with Retry-After, so that admitted requests start fast. On a batch-1 bundle every request that comes while another answers is refused at the default: raise this (it is capped by --max-queue-wait-ms, so raise both) to let requests queue instead."),
    model_id: Optional[str] = typer.Option(None, "--model-id", help="The model's id in /v1/models and answers (default: the model's name as an identifier)."),
    max_request_s: float = typer.Option(300.0, "--max-request-s", min=0.1, help="A request that runs longer than this (from its arrival) ends with finish reason length and frees its rows."),
    prefill_chunk_tokens: Optional[int] = typer.Option(None, "--prefill-chunk-tokens", min=0, help="Prefill prompts longer than this in slices between decode steps, each slice sized so that it and the decode step after it take no longer than this many prompt tokens at a prompt's start: no stream waits longer than one such chunk (default: 128 without CUDA graphs, off with them; 0: off)."),
    batch: Optional[int] = typer.Option(None, "--batch", min=1, max=64, help="Sequences decoded together at most (default: the bundle's planned batch, `build --batch`; at most that; static batch buckets 1, 2, 4, ... up to it)."),
    cuda_graphs: bool = typer.Option(True, "--cuda-graphs/--no-cuda-graphs", help="Replay prefill and decode as CUDA graphs (GPU only), as `edgekit run` does."),
    preferred_path: str = typer.Option("fused", "--decode-path", help=DECODE_PATH_HELP),
    header_timeout_s: float = typer.Option(5.0, "--header-timeout-s", min=0.1, help="Close a connection whose request headers take longer than this."),
    max_connections_per_client: int = typer.Option(64, "--max-connections-per-client", min=1, help="Open connections one client address may hold (more get 429 at once); behind a reverse proxy every client has its address."),
    shutdown_deadline_s: float = typer.Option(10.0, "--shutdown-deadline-s", min=0.0, help="On SIGTERM/SIGINT answers in flight end at their next token; responses still open after this many seconds are cut."),
    skip_golden: bool = typer.Option(False, "--skip-golden", help="Verify signature and hashes only at start-up."),
    watchdog: bool = typer.Option(True, "--watchdog/--no-watchdog", help="Run the latency/power watchdog (budgets from the bundle's plan, made for its target)."),
    watchdog_log: Optional[Path] = typer.Option(None, "--watchdog-log", help="JSONL log of samples and events for `edgekit report` (default: STORE/watchdog.jsonl)."),
    log: Optional[Path] = typer.Option(None, "--log", help="JSON-lines log of requests, swaps, rollbacks and watchdog events (default: STORE/server.jsonl)."),
) -> None:
    """Serve a verified bundle over HTTP: OpenAI-compatible /v1/completions and /v1/chat/completions (streaming
    with "stream": true), /v1/models, /healthz, /metrics (Prometheus), and token-guarded plugin admin.

    A bundle without a tokenizer takes token-id prompts and answers each choice's token_ids; an answer that stopped
    on the model's end-of-sequence token lists that token last, as usage.completion_tokens counts it (and as
    `edgekit run --json` lists it)."""
    import gc

    from edgekit.cli_common import end_on_sigterm, err_console
    from edgekit.power.jsonl import JsonlLogger
    from edgekit.runtime.bundle_runtime import open_bundle
    from edgekit.runtime.http_guard import bind_listener, listen_url, make_uvicorn_server, read_admin_token
    from edgekit.runtime.plugin_store import StoreOwner
    from edgekit.runtime.server import create_app
    from edgekit.runtime.serving import ServingStack, open_store

    # Everything the operator can get wrong is checked before the bundle loads and before the store's
    # start-up recovery runs: a typo must not cost a plugin its probation. Then the port is bound and the store
    # claimed (a second server on it exits here, having touched nothing), and only then does anything load.
    # a SIGTERM while the bundle loads (golden vectors, CUDA graphs: seconds) ends through the clean-up below, not
    # by its default action (exit -15, nothing said); uvicorn takes SIGTERM over while it serves and hands it back
    end_on_sigterm()
    _check_decode_path(preferred_path)
    token = read_admin_token(admin_token_file)
    keys = _trusted_keys(bundle, trust, allow_dev_key, "is served only")
    store_dir = store or Path(str(bundle).rstrip("/") + ".store")
    listener = bind_listener(host, port)
    port = listener.getsockname()[1]  # --port 0: the one the system picked
    owner = StoreOwner.claim(store_dir)
    b = open_bundle(bundle, keys, allow_dev_key=allow_dev_key, golden=not skip_golden)
    buckets = b.serving_buckets(batch)  # before the store's recovery: a refused --batch touches nothing
    st = open_store(store_dir, b, keys, allow_dev_key=allow_dev_key, owner=owner)
    for line in st.recovery:
        err_console.print(f"[yellow]store recovered:[/] {line}")
    server_log = JsonlLogger(log or store_dir / "server.jsonl")
    stack = None
    try:  # however start-up or serving ends (a SIGTERM while loading too), the stack closes and saves probations
        stack = ServingStack(b, st, max_waiting=max_waiting, cuda_graphs=cuda_graphs, batch_buckets=buckets,
                             max_queue_wait_s=max_queue_wait_ms / 1000, log=server_log, decode_path=preferred_path,
                             max_request_s=max_request_s, prefill_chunk_tokens=prefill_chunk_tokens, model_name=model_id,
                             max_admission_wait_s=max_admission_wait_ms / 1000)
        if watchdog:
            if b.watchdog_budgets is None:
                err_console.print("[yellow]note:[/] the bundle's plan records no watchdog budgets (an older build): "
                                  "the watchdog's defaults apply; rebuild to hold it to the target's")
            stack.start_watchdog(log_path=watchdog_log or store_dir / "watchdog.jsonl")  # budgets: the bundle's plan
        app = create_app(stack.engine, admin_token=token, plugins=stack.admin, log=server_log)
        server = make_uvicorn_server(app, host, port, header_timeout_s=header_timeout_s,
                                     on_shutdown=stack.engine.finish_all, shutdown_deadline_s=shutdown_deadline_s,
                                     max_connections_per_client=max_connections_per_client)
        # Everything loaded so far lives as long as the server: keep it out of the collector's way, so a gen-2
        # collection under load does not stall the device thread for hundreds of milliseconds.
        gc.freeze()
        err_console.print(f"serving {b.config.name} ({b.backend}, "
                          f"{'CUDA graphs' if stack.engine.graphed else 'eager'}, decode path {stack.engine.decode_path.name}, "
                          f"batch buckets {list(buckets)}) on {listen_url(host, port)}  store {store_dir}")
        for note in b.notes:
            err_console.print(f"[yellow]note:[/] {note}")
        server.run(sockets=[listener])  # SIGINT/SIGTERM end this cleanly
    finally:
        if stack is not None:
            stack.close()  # probation progress saved with a clean-stop mark: the next start resumes it
