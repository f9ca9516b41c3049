"""`edgekit build`: load -> plan -> quantize (gated) -> cross-compile -> golden vectors -> ONNX -> signed bundle.

Runs on any x86 or ARM host without a GPU: every kernel is cross-compiled for
the target's arch by Triton. Stages that are expensive and deterministic
(quantization, kernel compiles, the ONNX export) go through a content-addressed
cache, so an unchanged rebuild is fast; the bundle itself is deterministic
(same inputs -> same hashes).
"""

from __future__ import annotations

import dataclasses

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from edgekit import __version__
from edgekit.cache import BuildCache, cache_key, cache_limit_bytes, package_source_hash
from edgekit.errors import BundleError
from edgekit.kernels.arch import arch_name
from edgekit.measured_on import CPU
from edgekit.precision_names import DEFAULT_PRECISION

PLUGIN_VERSION = 1
DEFAULT_TARGET = "orin"


@dataclass
class BuildOptions:
    model: str | None
    out: Path
    target: str | None = None  # None: the plan's (with --plan), else "orin"
    key: Path | None = None
    dev_key: bool = False
    precision: str | None = None  # int8 (= W8A16, the default) | w8a8 | int4 (= W4A16) | fp16; None: the plan's
    context: int | None = None
    batch: int | None = None  # None: 1, or the plan's
    buckets: tuple[int, ...] | None = None
    trace: Path | None = None
    allow_mixed: bool = False
    quantize_head: bool = False  # the LM head too (when tied, the embedding with it: one matrix), behind the same gate
    head_scheme: str | None = None  # the quantized head's scheme (None: the mode's; "w8a16" for an INT4 model's INT8 head)
    archive: bool = False
    tensorrt_onnx: bool = False
    onnx: bool = True
    force: bool = False
    targets_dir: Path | None = None
    cache_dir: Path | None = None
    use_cache: bool = True
    plan: Path | None = None  # a plan written by `edgekit plan -o`: executed as written (shapes, target, precision, tiles)


@dataclass
class BuildResult:
    out: Path
    manifest: object
    summary: dict
    stage_seconds: dict[str, float] = field(default_factory=dict)


class _Stages:
    """Times each stage and reports its start and its successful end to a progress callback."""

    def __init__(self, report: Callable[[str, str], None] | None):
        self.report = report or (lambda stage, state: None)
        self.seconds: dict[str, float] = {}

    def run(self, name: str, fn, *args, **kw):
        self.report(name, "start")
        t = time.perf_counter()
        try:
            result = fn(*args, **kw)
        finally:
            self.seconds[name] = round(time.perf_counter() - t, 3)
        self.report(name, "done")  # only when it did: an error or Ctrl-C must not print "done"
        return result


def compile_plan(plan, arch: int, budget: int, store=None) -> dict[str, tuple[dict, dict]]:
    """op -> (kernel -> CompiledKernel, launch program) for exactly the plan's variants.

    A choice the planner already compiled is shipped as it is; only a plan read back from a document
    compiles here (each variant once).
    """
    from edgekit.kernels.aot import compile_variant
    from edgekit.kernels.variants import op_program

    from edgekit.kernels.variants import op_kernels

    compiled = {}
    for op in plan.operator_names():
        if op not in op_kernels():
            continue  # no Triton kernels for it (yet): no plugin; the runtime runs its torch reference
        chosen = [t for t in plan.tiles if t.op == op]
        if not chosen:
            raise BundleError(f"the plan chose no kernel variant for {op}, which the model runs",
                              hint="re-plan: a plan made with --no-tiles cannot be built")
        kernels = {t.kernel: t.compiled or compile_variant(t.variant, arch, budget_bytes=budget, store=store) for t in chosen}
        compiled[op] = (kernels, op_program(op, plan.variants(op), aot=True))
    return compiled


# What a cached intake's config.json holds; a new ModelConfig field read from the file bumps it, or an entry cached
# before would come back without it (2: rope_scaling, which a Llama 3 GGUF's rope_freqs sets)
INTAKE_CONFIG_FORMAT = 2


def _intake(spec: str | None, cache: BuildCache, keep_int4: bool = False, keep_q8_0: bool = False):
    """The model's config and tokenizer, cached by the weights' hash; the weights themselves load on demand.

    A GGUF needs ~10 s to parse and dequantize on this CPU; an unchanged rebuild whose quantized weights
    are cached never needs them.
    """
    from edgekit.model.config import ModelConfig
    from edgekit.model.loader import ModelSource, load_model, resolve_model_spec
    from edgekit.model.tokenizer import tokenizer_from_directory

    kind, location = resolve_model_spec(spec)
    if kind == "preset":
        return load_model(spec)
    if not cache.enabled:
        return load_model(spec, keep_int4=keep_int4, keep_q8_0=keep_q8_0)
    from edgekit.model.loader import LoadedModel, file_sha256

    path = Path(location)
    digest = file_sha256(path) if kind == "gguf" else None
    if digest is None:  # a directory: hashing it is the loader's job
        return load_model(spec, keep_int4=keep_int4, keep_q8_0=keep_q8_0)
    key = cache_key(stage="intake", kind=kind, sha256=digest, edgekit=__version__, config_format=INTAKE_CONFIG_FORMAT)
    hit = cache.get("intake", key)
    if hit is None:
        loaded = load_model(spec, keep_int4=keep_int4, keep_q8_0=keep_q8_0)
        loaded.tokenizer_files = _tokenizer_files(loaded.tokenizer)
        cache.put("intake", key, {"config.json": json.dumps(loaded.config.to_dict()).encode(), **loaded.tokenizer_files})
        return loaded
    cfg = ModelConfig.from_dict(json.loads(hit.pop("config.json")))
    tok = None
    if "tokenizer.json" in hit:
        with tempfile.TemporaryDirectory() as d:
            for name, data in hit.items():
                Path(d, name).write_bytes(data)
            tok = tokenizer_from_directory(Path(d))
    loaded = LoadedModel(cfg, ModelSource(kind, str(path), digest), None, tok)
    loaded.tokenizer_files = hit  # the very bytes a cold build wrote: the bundle stays byte-identical
    return loaded


def _tokenizer_files(tokenizer) -> dict[str, bytes]:
    if tokenizer is None:
        return {}
    with tempfile.TemporaryDirectory() as d:
        tokenizer.save(Path(d))
        return {p.name: p.read_bytes() for p in sorted(Path(d).iterdir()) if p.is_file()}


def keeps_q8_0_table(opts) -> bool:
    """Whether a GGUF's Q8_0 embedding / LM head is taken in bit for bit (grouped INT8): with --quantize-head and no
    --head-precision. A --head-precision re-quantizes it: int8 (per-row scales) is what the fused decode head takes,
    int4 the smallest."""
    return opts.quantize_head and opts.head_scheme is None


def _ensure_weights(loaded, spec: str | None, keep_int4: bool = False, keep_q8_0: bool = False):
    """Fill in the weights of a model whose config and tokenizer came from the cache.

    ``keep_int4`` (an INT4 build): a GGUF's 4-bit projections stay W4A16 records, bit for bit; ``keep_q8_0``
    (a build with --quantize-head): a Q8_0 embedding / LM head stays grouped INT8, bit for bit."""
    if loaded.weights is None:
        from edgekit.model.loader import load_model

        loaded.weights = load_model(spec, tokenizer=False, keep_int4=keep_int4, keep_q8_0=keep_q8_0).weights
    return loaded


def _checked_weights(loaded, spec: str | None, steps, keep_int4: bool = False, keep_q8_0: bool = False):
    """The model with its weights, checked for damage first (non-finite values, absurd perplexity: seconds) so a
    broken file is named before minutes of quantization blame the quantizer."""
    from edgekit.quant.source_check import check_source_model

    _ensure_weights(loaded, spec, keep_int4, keep_q8_0)
    with steps.task("check the source model (finite weights, perplexity)", 1) as advance:
        check_source_model(loaded)
        advance()
    return loaded


def _quantize(loaded, mode: str, opts: BuildOptions, cache: BuildCache, steps):
    """(weights, report) of the quantized model, cached by model hash and options."""
    from edgekit.quant.gate import GateConfig
    from edgekit.model.weights_file import load_weights_file, serialize
    from edgekit.quant.io import report_bytes
    from edgekit.quant.quantize import QuantizeOptions, quantize_model

    gate = GateConfig.for_mode(mode)
    qopts = QuantizeOptions(quantize_head=opts.quantize_head, head_scheme=opts.head_scheme)
    keep_int4, keep_q8_0 = mode == "w4a16", keeps_q8_0_table(opts)
    # an INT4 build takes a GGUF's 4-bit projections in as they are, a quantized head a Q8_0 table: the intake
    # code is part of the key then
    lossless = [k for k, on in (("lossless-int4", keep_int4), ("lossless-q8_0-head", keep_q8_0)) if on]
    intake = {"intake": "+".join(lossless), "intake_source": package_source_hash("edgekit.model")} if lossless else {}
    key = cache_key(stage="quantize", model=loaded.source.content_identity(), config=loaded.config.to_dict(), mode=mode, gate=gate.to_dict(), **intake,
                    options={k: str(v) for k, v in vars(qopts).items()}, allow_mixed=opts.allow_mixed, edgekit=__version__,
                    source=package_source_hash("edgekit.quant"))
    hit = cache.get("quantize", key)
    if hit is None:
        _checked_weights(loaded, opts.model, steps, keep_int4, keep_q8_0)
        result = quantize_model(loaded, mode, gate=gate, allow_mixed=opts.allow_mixed, options=qopts, steps=steps,
                                reference_cache=cache)
        hit = {"model.safetensors": serialize(result.config, result.weights, result.kv_scales, torch.float16, {"mode": mode}),
               "report.json": report_bytes(result.report)}
        cache.put("quantize", key, hit)
        cached = False
    else:
        cached = True
    # Cold and warm builds read the weights back from the same bytes, so they ship identical bundles.
    with tempfile.TemporaryDirectory() as d:
        Path(d, "model.safetensors").write_bytes(hit["model.safetensors"])
        q = load_weights_file(Path(d), dtype=torch.float16)
    return q.weights, json.loads(hit["report.json"]), cached


def build_bundle(opts: BuildOptions, report: Callable[[str, str], None] | None = None, steps=None) -> BuildResult:
    """``report(stage, "start"|"done")`` for each stage; ``steps`` (edgekit.quant.progress.Steps) for the progress
    inside the long ones (the source check, quantization, kernel compiles)."""
    from edgekit.bundle.keys import chosen_signing_key
    from edgekit.bundle.manifest import Buckets, ModelIdentity, Target
    from edgekit.bundle.plugin import plugin_from_compiled
    from edgekit.bundle.writer import BundleWriter, archive_path_of, check_archive_destination, check_bundle_destination
    from edgekit.kernels.aot import compile_variant
    from edgekit.kernels.registry import operator
    from edgekit.builder.plan_contract import check_plan_inputs, check_plan_precision, options_from_plan, read_plan
    from edgekit.plan.planner import check_memory, make_plan
    from edgekit.plan.precision import PrecisionPlan
    from edgekit.plan.targets import load_target
    from edgekit.kernels.weight_schemes import scheme_of_cli
    from edgekit.model.weights_file import serialize
    from edgekit.output_path import check_output_path
    from edgekit.quant.progress import SILENT

    t_start = time.perf_counter()
    given = read_plan(opts.plan) if opts.plan is not None else None  # a bad plan file fails before any work
    if given is not None:
        opts = options_from_plan(opts, given)
    else:
        opts = dataclasses.replace(opts, target=opts.target or DEFAULT_TARGET, precision=opts.precision or DEFAULT_PRECISION,
                                   batch=opts.batch or 1)
    scheme = scheme_of_cli(opts.precision)  # refuses an unknown precision, naming the valid ones
    key = chosen_signing_key(opts.key, opts.dev_key, "a bundle")  # fail before any work
    check_bundle_destination(opts.out, overwrite=opts.force)  # before any work, not after minutes of build
    out = Path(opts.out)
    check_output_path(out, "-o", kind="dir")
    if opts.archive:
        check_archive_destination(archive_path_of(out), overwrite=opts.force)
        check_output_path(archive_path_of(out), "--archive", kind="file")
    load_target(opts.target, opts.targets_dir)  # an unknown target fails in milliseconds, not after the model loads
    cache = BuildCache(opts.cache_dir, enabled=opts.use_cache)
    cache_limit = cache_limit_bytes() if opts.use_cache else 0  # a bad EDGEKIT_CACHE_MAX_GB fails before any work
    st = _Stages(report)
    steps = steps or SILENT
    mode = scheme.name if scheme.quantized else None  # the quantizer's mode is the scheme it produces
    if opts.quantize_head and mode is None:
        raise BundleError("--quantize-head needs a quantized precision; --precision fp16 keeps every layer in FP16",
                          hint="drop --quantize-head, or use --precision int8 or int4")
    if opts.allow_mixed and mode is None:  # it was dropped without a word (exit 0)
        raise BundleError("--allow-mixed acts when the accuracy gate fails; --precision fp16 keeps every layer in FP16 "
                          "and has no gate", hint="drop --allow-mixed, or use --precision int8, w8a8 or int4")

    loaded = st.run("load", _intake, opts.model, cache, mode == "w4a16", bool(mode) and keeps_q8_0_table(opts))
    cfg = loaded.config
    model_info = {"name": cfg.name, "source": loaded.source.to_dict()}

    def target_that_fits():
        # the memory check needs no compile and no quantization: a model that cannot fit fails in milliseconds
        target = load_target(opts.target, opts.targets_dir)
        if given is not None:
            check_plan_inputs(given, cfg, loaded.source.to_dict(), target)
        else:
            check_memory(cfg, target, opts.precision, context=opts.context, batch=opts.batch, buckets=opts.buckets)
        return target

    target = st.run("target", target_that_fits)
    arch, budget = target.gpu.compute_capability, target.smem_budget_bytes

    quant_report, quant_cached = None, False
    if mode:
        weights, quant_report, quant_cached = st.run("quantize", _quantize, loaded, mode, opts, cache, steps)
    else:
        weights = _checked_weights(loaded, opts.model, steps).weights.to(dtype=torch.float16)

    decided = PrecisionPlan.from_weights(weights, quant_report=quant_report)  # a build's KV cache is FP16

    def plan_compiling():
        from edgekit.kernels.variants import op_kernels
        from edgekit.plan.tiles import needed_ops

        kernel_ops = [op for op in needed_ops(cfg, decided) if op in op_kernels()]
        seen: list[str] = []
        with steps.task(f"compile the kernels of {len(kernel_ops)} operators for {arch_name(arch)}", len(kernel_ops)) as advance:
            def compile_cached(v):
                if v.op not in seen:  # the solver works through the operators one by one
                    if seen:
                        advance()
                    seen.append(v.op)
                return compile_variant(v, arch, budget_bytes=budget, store=cache)

            return make_plan(cfg, target, model_info=model_info, context=opts.context, batch=opts.batch,
                             precision=decided, trace=opts.trace, buckets=opts.buckets, compile_fn=compile_cached)

    # The plan is made once every layer's precision is decided (or read from --plan, and held to the precision the
    # quantizer decided), and the rest of the build executes it verbatim.
    if given is not None:
        plan = st.run("plan", check_plan_precision, given, decided)
    else:
        plan = st.run("plan", plan_compiling)
    ops = sorted(plan.operator_names())
    compiled = st.run("compile", compile_plan, plan, arch, budget, cache)
    shapes = plan.static_shapes

    def goldens():
        return {op: golden_bytes(op, cfg, shapes, cache) for op in ops}

    golden = st.run("golden", goldens)

    with BundleWriter(out, overwrite=opts.force) as w:
        def write_parts():
            w.add_bytes("weights/model.safetensors", serialize(cfg, weights, None, torch.float16, {"mode": mode or "fp16"}))
            tok_files = getattr(loaded, "tokenizer_files", None)
            if tok_files is None:
                tok_files = _tokenizer_files(loaded.tokenizer)
            for name in sorted(tok_files):
                w.add_bytes(f"tokenizer/{name}", tok_files[name])
            w.add_json("plan.json", plan.to_dict())
            if quant_report is not None:
                w.add_json("quantization/report.json", quant_report)
            for op in ops:
                if op not in compiled:
                    continue  # the reference path (see compile_plan)
                ck, program = compiled[op]
                meta, files = plugin_from_compiled(op, PLUGIN_VERSION, ck, program, golden[op],
                                                   description=f"{op} for {target.name} ({arch_name(arch)}), built by edgekit {__version__}")
                w.add_plugin(meta, files)

        st.run("write", write_parts)
        onnx_info = None
        # the portable (prefill) graph needs a fallback body for every projection's operator; the bundle is
        # complete without the graph
        no_onnx = [op for op in ops if operator(op).scheme and operator(op).onnx is None]
        if opts.onnx and no_onnx:
            onnx_info = {"skipped": f"no ONNX function for {', '.join(no_onnx)} yet: model.onnx not written"}
        elif opts.onnx:
            onnx_info = st.run("onnx", _export_onnx, cfg, weights, shapes, w, cache, opts.tensorrt_onnx)
        manifest = st.run("sign", w.finish, key=key, target=Target(name=target.name, arch=arch),
                          model=ModelIdentity(name=cfg.name, source_kind=loaded.source.kind, sha256=loaded.source.sha256,
                                              seed=loaded.source.seed),
                          plan=plan.to_dict(), precision=_precision_by_op(weights, ops),
                          buckets=Buckets(prompt_lengths=list(shapes.buckets), max_seq_len=shapes.max_seq_len, batch=shapes.batch))
    archive_path = None
    if opts.archive:
        from edgekit.bundle.archive import write_archive

        archive_path = st.run("archive", write_archive, out, archive_path_of(out), overwrite=opts.force)
    pruned = cache.prune(cache_limit)  # after the bundle is written: a build never waits on, or fails for, pruning
    summary = _summary(cfg, target, arch, budget, plan, compiled, manifest, out, quant_report, quant_cached,
                       onnx_info, key.is_dev, st.seconds, time.perf_counter() - t_start, cache, archive_path)
    summary["cache"]["pruned"] = pruned.to_dict()
    return BuildResult(out, manifest, summary, st.seconds)


def golden_bytes(op: str, cfg, shapes, cache: BuildCache | None = None) -> bytes:
    """Golden vectors of one operator, cached by everything that determines them (incl. the reference's source).

    Also what `edgekit plugin pack --kernel-source` ships (no cache there: it computes them once).
    """
    import hashlib
    import inspect

    from edgekit.builder import golden as build_golden
    from edgekit.bundle import golden as golden_mod
    from edgekit.bundle.golden import golden_to_bytes
    from edgekit.kernels import operator as operator_mod
    from edgekit.kernels.registry import OPERATORS

    cache = BuildCache(None, enabled=False) if cache is None else cache
    sources = "".join(inspect.getsource(m) for m in (build_golden, golden_mod, operator_mod,
                                                     inspect.getmodule(OPERATORS[op].reference)))
    key = cache_key(stage="golden", op=op, config=cfg.to_dict(), buckets=list(shapes.buckets), context=shapes.max_seq_len,
                    torch=torch.__version__, source=hashlib.sha256(sources.encode()).hexdigest())
    hit = cache.get("golden", key)
    if hit is not None:
        return hit["golden.safetensors"]
    data = golden_to_bytes(op, build_golden.golden_cases(op, cfg, shapes.buckets, shapes.max_seq_len))
    cache.put("golden", key, {"golden.safetensors": data})
    return data


def _precision_by_op(weights, ops: list[str]) -> dict[str, str]:
    # activations are fp16 everywhere, accumulation fp32 (int32 for int8 x int8); the plugins' metadata has the detail
    from edgekit.kernels.registry import operator

    return {op: operator(op).scheme or "fp16" for op in sorted(ops)}


def _export_onnx(cfg, weights, shapes, writer, cache: BuildCache, tensorrt: bool) -> dict:
    """model.onnx for one bucket (the smallest >= 64: the portable fallback graph), via the cache."""
    from edgekit.export import export_onnx

    bucket = next((b for b in shapes.buckets if b >= 64), shapes.buckets[-1])
    blob = serialize_weights_hash(cfg, weights)
    key = cache_key(stage="onnx", weights=blob, bucket=bucket, tensorrt=tensorrt, edgekit=__version__)
    hit = cache.get("onnx", key)
    if hit is None:
        with tempfile.TemporaryDirectory() as d:
            res = export_onnx(cfg, weights, bucket, Path(d) / "model.onnx", dtype="float16", tensorrt_flavour=tensorrt,
                              external_data=False)
            files = {p.name: p.read_bytes() for p in Path(d).iterdir() if p.is_file()}
            files["export.json"] = json.dumps({"seconds": res.seconds, "op_counts": res.op_counts, "n_nodes": res.n_nodes},
                                              sort_keys=True).encode()
        cache.put("onnx", key, files)
        hit = files
    info = json.loads(hit.pop("export.json"))
    for name in sorted(hit):
        writer.add_bytes(f"onnx/{name}", hit[name])
    return {"bucket": bucket, "files": sorted(hit), **info}


def serialize_weights_hash(cfg, weights) -> str:
    """A hash of the exact weights the bundle ships (what every weight-dependent stage is keyed on)."""
    import hashlib

    from edgekit.model.weights_file import serialize

    return hashlib.sha256(serialize(cfg, weights, None, torch.float16)).hexdigest()


def _summary(cfg, target, arch, budget, plan, compiled, manifest, out, quant_report, quant_cached, onnx_info, dev_key,
             seconds, total_s, cache: BuildCache, archive_path) -> dict:
    ops = []
    for op, (cks, _) in sorted(compiled.items()):
        for kname, ck in sorted(cks.items()):
            ops.append({"op": op, "kernel": kname, "shared_bytes": ck.shared_bytes, "budget_bytes": budget,
                        "num_warps": ck.num_warps, "num_stages": ck.num_stages, "registers": ck.registers,
                        "constexprs": dict(ck.variant.constexprs), "arch": arch_name(ck.arch),
                        "shared_bytes_source": "compiled kernel metadata (Triton)"})
    parts: dict[str, int] = {}
    for rel, entry in manifest.files.items():
        top = rel.split("/", 1)[0]
        parts[top] = parts.get(top, 0) + entry.size
    return {
        "bundle": str(out),
        "archive": str(archive_path) if archive_path else None,
        "target": {"name": target.name, "arch": arch_name(arch), "shared_memory_budget_bytes": budget},
        "model": {"name": cfg.name, "parameters": cfg.n_params},
        "operators": ops,
        "precision": manifest.precision,
        "buckets": list(plan.shapes.buckets),
        "context": plan.shapes.context,
        "memory": plan.memory.to_dict(),
        "predictions": plan.roofline,
        "quantization": None if quant_report is None else {
            "mode": quant_report.get("mode"), "gate": quant_report.get("gate"), "cached": quant_cached,
            "head_embedding": quant_report.get("head_embedding"), "measured_on": quant_report.get("measured_on")},
        "onnx": onnx_info,
        "signed_with_dev_key": dev_key,
        "has_tokenizer": "tokenizer" in parts,  # without one, run and serve take and give token ids
        "bundle_bytes_by_part": parts,
        "bundle_bytes": sum(parts.values()),
        "stage_seconds": seconds,
        "build_seconds": round(total_s, 3),
        "build_measured_on": CPU,  # the build runs on this machine's CPU (cross-compiles; no GPU)
        "cache": {"hits": sorted(set(cache.hits)), "misses": sorted(set(cache.misses))},
    }
