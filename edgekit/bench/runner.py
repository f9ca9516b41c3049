"""Run the benchmark: every (model, precision, engine, context) in one process, in a fixed order.

Order: for each model, for each precision, edgekit's runtime then the compiled
reference; then transformers eager (FP16); transformers static cache + compile
comes last for every model (the slowest to set up and the likeliest to fail).
A failure is recorded in its row and the run goes on; with a time budget,
work that would start after it is recorded as skipped. Weights are random for
presets (speed does not depend on values) and identical for every engine of a
model: one FP16 master copy on the host, from which each precision is made on
the device and the transformers twin is filled.
"""

from __future__ import annotations

import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from datetime import datetime, timezone
from typing import Callable, Optional

import torch

from edgekit.bench import document as docm
from edgekit.bench.document import PRECISIONS, BenchDocument, Row
from edgekit.bench.engines import (
    BASELINES, ENGINE_LABELS, KNOWN_BASELINES, CompiledReferenceEngine, HFGenerateEngine, RuntimeEngine,
    apply_inductor_flags,
)
from edgekit.bench.measure import EnergyMeter, copy_bandwidth, device_info, median, sync, timed
from edgekit.bench.stepped import (  # noqa: F401 - re-exported: they lived here (tests, tools)
    KV_BYTES_PER_ELEMENT, ReferenceRun, _check_tokens, _energy, _prompt, _roofline, _short, measure_stepped,
    reference_run, reference_tokens,
)
from edgekit.errors import BenchmarkError, EdgekitError
from edgekit.measured_on import in_words, measured_on
from edgekit.kernels.linear import LinearWeights
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import BlockWeights, ModelWeights
from edgekit.model.embedding import tied_embedding

MAX_SMS = 1024  # a sanity bound on --sms (the device's own count is checked when the partition is made)


@dataclass
class BenchSettings:
    models: list[str]
    precisions: tuple[str, ...] = ("fp16", "int8")
    contexts: tuple[int, ...] = (128, 512, 2048)
    new_tokens: int = 64  # decoded after the first token (stepped engines and transformers compiled)
    hf_new_tokens: int = 16  # transformers eager is launch-bound (~20 tok/s): fewer tokens, same rate
    repeats: int = 3
    baselines: tuple[str, ...] = BASELINES
    check_tokens: int = 8
    seed: int = 0
    energy: bool = True
    prefill_graph: bool = True
    profile: bool = True  # edgekit rows: where the decode step's time goes (torch.profiler over one loop)
    time_budget_s: Optional[float] = None
    device: str = "cuda"
    llama_bench: Optional[str] = None  # llama.cpp's llama-bench (a path or a command on PATH): the llama.cpp baseline
    llama_quantize: Optional[str] = None  # llama-quantize: Q8_0 / Q4_K_M copies of a preset's F16 GGUF
    gguf_dir: Optional[str] = None  # where a preset's GGUF files are written (default: a temporary folder)
    fused: bool = True  # also measure edgekit's fused decode path (the one `edgekit run` takes when it can)
    sms: tuple[int, ...] = ()  # also run the fused decode confined to each of these SM counts (edgekit.bench.partition_run)

    def validate(self) -> None:
        bad = [p for p in self.precisions if p not in PRECISIONS]
        if bad:
            raise BenchmarkError(f"unknown precision(s) {bad}; expected some of {list(PRECISIONS)}")
        bad = [b for b in self.baselines if b not in KNOWN_BASELINES]
        if bad:
            raise BenchmarkError(f"unknown baseline(s) {bad}; expected some of {list(KNOWN_BASELINES)}")
        self._validate_llama_cpp()
        if not self.models:
            raise BenchmarkError("no model given", hint="pass MODEL, e.g. preset:smollm2-135m")
        if not self.contexts or min(self.contexts) < 1:
            raise BenchmarkError(f"contexts must be positive token counts, got {list(self.contexts)}")
        for name, v in (("new tokens", self.new_tokens), ("transformers new tokens", self.hf_new_tokens), ("repeats", self.repeats)):
            if v < 1:
                raise BenchmarkError(f"{name} must be >= 1, got {v}")
        bad = [n for n in self.sms if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_SMS]
        if bad or len(set(self.sms)) != len(self.sms):
            raise BenchmarkError(f"--sms takes distinct SM counts in [1, {MAX_SMS}], got {list(self.sms)}",
                                 hint="e.g. --sms 8,16 (an Orin has 16 SMs, 8 in its 30 W mode)")
        if not 1 <= self.check_tokens <= min(self.new_tokens, self.hf_new_tokens) + 1:
            raise BenchmarkError(f"check tokens must be in [1, {min(self.new_tokens, self.hf_new_tokens) + 1}] "
                                 f"(the first token plus the decoded ones), got {self.check_tokens}")

    def _validate_llama_cpp(self) -> None:
        """Everything the llama.cpp baseline needs, checked before any GPU work: binaries, and GGUF-able models."""
        from edgekit.bench.llamacpp import resolve_binary
        from edgekit.model.loader import resolve_model_spec
        from edgekit.model.presets import preset_config

        if "llama.cpp" not in self.baselines:
            if self.llama_bench or self.llama_quantize:
                raise BenchmarkError("--llama-bench / --llama-quantize given without the llama.cpp baseline",
                                     hint="add llama.cpp to --baselines, e.g. --baselines compile,llama.cpp")
            return
        if not self.llama_bench:
            raise BenchmarkError("--baselines llama.cpp needs --llama-bench PATH (llama.cpp's llama-bench binary)",
                                 hint="pass --llama-bench build/bin/llama-bench (and --llama-quantize build/bin/llama-quantize "
                                      "for the Q8_0 / Q4_K_M copies of a preset)")
        resolve_binary(self.llama_bench, "llama-bench", "--llama-bench")
        if self.llama_quantize:
            resolve_binary(self.llama_quantize, "llama-quantize", "--llama-quantize")
        for spec in self.models:
            kind, location = resolve_model_spec(spec)
            if kind == "hf":
                raise BenchmarkError(f"{spec}: llama.cpp reads GGUF files and this is a Hugging Face directory",
                                     hint="pass the model as a .gguf file, or drop llama.cpp from --baselines")
            if kind == "preset" and preset_config(location).architecture != "llama":
                raise BenchmarkError(f"{spec}: edgekit writes llama-architecture GGUF files for llama.cpp; this preset is "
                                     f"{preset_config(location).architecture}",
                                     hint="use a llama-architecture preset (smollm2-135m, llama-3.2-1b, ...) or a .gguf file")

    @property
    def max_seq_len(self) -> int:
        need = max(self.contexts) + max(self.new_tokens, self.hf_new_tokens) + 1
        return -(-need // 64) * 64  # one static cache length for every context (rounded to 64 positions)


# --------------------------------------------------------------------------- weights
def _cast(w: ModelWeights, device, dtype: torch.dtype) -> ModelWeights:
    """ModelWeights.to, except that a tied head stays the embedding tensor (no second copy on the device)."""

    def mv(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)

    emb = mv(w.tok_embeddings)
    tied = w.lm_head.weight is w.tok_embeddings
    head = LinearWeights("linear", emb, mv(w.lm_head.bias)) if tied else w.lm_head.to(device, dtype)
    blocks = [
        BlockWeights(**{name: mv(t) for name, t in b.norms().items()},
                     **{name: lw.to(device, dtype) for name, lw in b.linears().items()})
        for b in w.blocks
    ]
    return ModelWeights(tok_embeddings=emb, blocks=blocks, norm=mv(w.norm), lm_head=head)


def int4_linear(lw: LinearWeights) -> LinearWeights:
    """Round-to-nearest asymmetric INT4 (W4A16, FP16 group scales and offsets, GGML Q4_1 style) of a float projection,
    in groups of 128 (64 or 32 where K needs it): speed runs only (the calibrated route is edgekit.quant)."""
    from edgekit.kernels.int4_layout import GROUP_SIZES, quantize_int4_rtn

    k = lw.weight.shape[1]
    group = max((g for g in GROUP_SIZES if k % g == 0), default=GROUP_SIZES[0])  # none: quantize_int4_rtn says why
    q, s, off = quantize_int4_rtn(lw.weight, group, symmetric=False, scale_dtype=torch.float16)
    return LinearWeights("linear_w4a16", q, lw.bias, s, offset=off)


def quantized(w: ModelWeights, precision: str) -> ModelWeights:
    """W8A16 (int8) or W4A16 g128 RTN (int4) records for every block linear (and the LM head for int8-head /
    int4-head, which a tied model's lookup then reads); norms shared."""
    from edgekit.quant.weights import quantize_linear

    if precision == "fp16":
        return w
    def make(lw: LinearWeights, name: str) -> LinearWeights:
        return int4_linear(lw) if precision.startswith("int4") else quantize_linear(lw, "w8a16", name)

    blocks = [
        BlockWeights(**b.norms(), **{name: make(lw, f"blocks.{i}.{name}") for name, lw in b.linears().items()})
        for i, b in enumerate(w.blocks)
    ]
    head, emb = w.lm_head, w.tok_embeddings
    if precision.endswith("-head"):
        head = make(LinearWeights("linear", head.weight, head.bias), "lm_head")
        if w.tied:  # one quantized matrix serves the lookup too, as a build stores it (edgekit.model.embedding)
            emb = tied_embedding(head, emb.dtype)
    return ModelWeights(tok_embeddings=emb, blocks=blocks, norm=w.norm, lm_head=head)


class WeightStore:
    """One FP16 master per model on the host; at most one (model, precision) on the device at a time.

    ``files`` maps a preset to the F16 GGUF written for it (the llama.cpp baseline): edgekit then loads that file,
    so both engines read identical weights.
    """

    def __init__(self, seed: int, device: torch.device, files: dict[str, Path] | None = None):
        self.seed, self.device = seed, device
        self.files = dict(files or {})
        self._master: dict[str, tuple[ModelConfig, ModelWeights, dict]] = {}
        self._on_device: tuple[tuple[str, str], ModelWeights] | None = None

    def master(self, spec: str) -> tuple[ModelConfig, ModelWeights, dict]:
        if spec not in self._master:
            self._master[spec] = _load_master(spec, self.seed, self.files.get(spec))
        return self._master[spec]

    def on_device(self, spec: str, precision: str) -> ModelWeights:
        key = (spec, precision)
        if self._on_device is None or self._on_device[0] != key:
            self.drop()
            _, w16, _ = self.master(spec)
            self._on_device = (key, quantized(_cast(w16, self.device, torch.float16), precision))
        return self._on_device[1]

    def drop(self) -> None:
        self._on_device = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _load_master(spec: str, seed: int, gguf: Path | None = None) -> tuple[ModelConfig, ModelWeights, dict]:
    from edgekit.model.loader import load_model, resolve_model_spec
    from edgekit.model.presets import preset_config
    from edgekit.model.weights import random_weights

    kind, location = resolve_model_spec(spec)
    if kind == "preset" and gguf is not None:
        m = load_model(str(gguf), tokenizer=False)
        cfg, w = m.config, _cast(m.weights, "cpu", torch.float16)
        info = {"source": "preset", "location": str(gguf), "sha256": m.source.sha256,
                "weights": f"random (seed {seed}) written as an F16 GGUF and loaded back: the file llama.cpp reads"}
    elif kind == "preset":
        cfg = preset_config(location)
        # straight to FP16 tensor by tensor: a 1.5B model never sits on the host in FP32
        w = random_weights(cfg, seed=seed, dtype=torch.float16, device="cpu")
        info = {"source": "preset", "weights": f"random (seed {seed}): speed does not depend on values"}
    else:
        m = load_model(spec, tokenizer=False)
        cfg, w = m.config, _cast(m.weights, "cpu", torch.float16)
        info = {"source": m.source.kind, "location": m.source.location, "sha256": m.source.sha256, "weights": "the model's own"}
    return cfg, w, {**info, "config": cfg.to_dict(), "n_params": cfg.n_params, "shape_of": docm.shape_of(cfg)}


EXTRA_ROUNDS = 3  # more rounds of both timings before a decode "not slower than the prefill" fails its row


@torch.no_grad()
def measure_generate(engine: HFGenerateEngine, prompt: torch.Tensor, s: BenchSettings, meter: Optional[EnergyMeter], row: Row) -> list[int]:
    dev, T = engine.device, prompt.shape[1]
    n = s.hf_new_tokens if engine.name == "hf-eager" else s.new_tokens
    # warm-up with the very calls that are timed: a static cache is sized by the call, so another
    # length would compile (and record CUDA graphs) again
    for _ in range(2 if engine.compiled else 1):
        engine.generate(prompt, n + 1)
    engine.generate(prompt, 1)
    sync(dev)

    def batch(k: int):
        return [timed(lambda: engine.generate(prompt, k), dev) for _ in range(s.repeats)]

    if meter is not None:
        pre, w_pre, _ = meter.measure(lambda: batch(1), dev)
        full, w_full, _ = meter.measure(lambda: batch(n + 1), dev)
    else:
        pre, full, w_pre, w_full = batch(1), batch(n + 1), None, None
    row.prefill_s_repeats = [t for _, t in pre]
    row.decode_s_repeats = [t for _, t in full]  # whole generate calls of n + 1 tokens
    t_pre, t_full = median(row.prefill_s_repeats), median(row.decode_s_repeats)
    # the decode time is a difference of two timings: on a busy CPU a few short calls can invert it (a tiny model's
    # 4 tokens under a neighbour's load). Before calling the row failed, time both again, up to EXTRA_ROUNDS more
    # rounds, and judge the medians of every call (all of them kept in the row)
    for _ in range(EXTRA_ROUNDS if meter is None else 0):
        if t_full > t_pre:
            break
        row.prefill_s_repeats += [t for _, t in batch(1)]
        more = batch(n + 1)
        row.decode_s_repeats += [t for _, t in more]
        full = full + more
        t_pre, t_full = median(row.prefill_s_repeats), median(row.decode_s_repeats)
    t_dec = t_full - t_pre
    row.new_tokens = n
    row.ttft_ms, row.prefill_tokens_per_s = 1000 * t_pre, T / t_pre
    row.prefill_note = "generate(max_new_tokens=1): transformers' own prefill, uncompiled"
    if t_dec <= 0:
        raise RuntimeError(f"generate of {n + 1} tokens ({t_full:.4f} s) was not slower than of 1 ({t_pre:.4f} s), "
                           f"medians of {len(row.decode_s_repeats)} calls each")
    row.decode_tokens_per_s, row.decode_ms_per_token = n / t_dec, 1000 * t_dec / n
    if w_pre is not None and w_full is not None:
        e_dec = (w_full.energy_mj - w_pre.energy_mj) / s.repeats  # one call's decode part
        row.energy_mj_per_token = e_dec / n
        row.power_w = e_dec / 1000 / t_dec
        row.energy_window_s = w_full.seconds
        row.energy_note = "(energy of generate(n+1) - energy of generate(1)) / n, per call, averaged over the repeats"
    return [int(t) for t in full[-1][0].tolist()]


# --------------------------------------------------------------------------- the run
@dataclass
class _Task:
    spec: str
    precision: str
    engine: str


def plan_tasks(s: BenchSettings) -> list[_Task]:
    """In-process engines first; llama.cpp (a subprocess that needs the GPU's memory) last, once per model."""
    tasks = []
    for spec in s.models:
        for p in s.precisions:
            tasks.append(_Task(spec, p, "edgekit"))
            if s.fused:
                tasks.append(_Task(spec, p, "edgekit-fused"))
            if "compile" in s.baselines:
                tasks.append(_Task(spec, p, "compile"))
        if "hf-eager" in s.baselines:
            tasks.append(_Task(spec, "fp16", "hf-eager"))
    if "hf-compile" in s.baselines:
        tasks += [_Task(spec, "fp16", "hf-compile") for spec in s.models]
    if "llama.cpp" in s.baselines:
        tasks += [_Task(spec, "gguf", "llama.cpp") for spec in s.models]
    return tasks


@dataclass
class BenchRun:
    settings: BenchSettings
    log: Callable[[str], None] = print
    on_update: Callable[[BenchDocument], None] = lambda doc: None
    command: str = ""
    _shapes: dict = field(default_factory=dict)
    _t_start: float = 0.0
    _llama_files: dict = field(default_factory=dict)  # spec -> {file type: GGUF path} (the llama.cpp baseline)

    def run(self) -> BenchDocument:
        s = self.settings
        s.validate()
        if s.device == "cuda" and not torch.cuda.is_available():
            raise BenchmarkError("edgekit bench measures on a CUDA GPU and this machine has none",
                                 hint="run it on a machine with a CUDA GPU; the CPU tests cover the arithmetic and the weight mapping")
        device = torch.device(s.device)
        self._t_start = time.monotonic()
        deadline = None if s.time_budget_s is None else self._t_start + s.time_budget_s
        info = device_info(device)
        where = measured_on(device)  # the vocabulary every command writes; the device's details are in ``device``
        doc = BenchDocument(
            measured_on=where, created=datetime.now(timezone.utc).isoformat(timespec="seconds"), command=self.command,
            device=info, settings={**{k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(s).items()},
                                   "max_seq_len": s.max_seq_len, "precision_meaning": {p: PRECISIONS[p] for p in s.precisions},
                                   "engines": {e: ENGINE_LABELS[e] for e in ("edgekit", *(("edgekit-fused",) if s.fused else ()),
                                                                               *((docm.PARTITION_ENGINE,) if s.sms else ()),
                                                                               *s.baselines)}},
        )
        doc.notes.append(f"every figure {in_words(where)} in this one process; medians of {s.repeats} repeats after warm-up")
        doc.notes.append(f"one static KV cache of {s.max_seq_len} positions per engine; edgekit's decode attention reads "
                         "only the filled positions, the torch reference (and so the compiled baseline) reads all of them")
        meter = None
        if s.energy:
            meter = EnergyMeter(device_index=device.index or 0) if device.type == "cuda" else None
            if meter is not None and not meter.available:
                doc.notes.append(f"no energy figures: {meter.reason}")
                meter = None
        bw = None
        if device.type == "cuda":
            doc.copy_bandwidth = copy_bandwidth(device)
            bw = doc.copy_bandwidth["bytes_per_s"]
            self.log(f"copy bandwidth {bw / 1e9:.0f} GB/s ({in_words(where)})")
        with llama_files(s, self.log) as files:
            return self._run_all(s, doc, device, where, deadline, meter, bw, files)

    def _run_all(self, s, doc, device, where, deadline, meter, bw, files) -> BenchDocument:
        store = WeightStore(s.seed, device, {spec: f[_F16] for spec, f in files.items() if _F16 in f})
        self._llama_files = files
        refs: dict[tuple[str, str, int], list[int]] = {}
        for task in plan_tasks(s):
            if deadline is not None and time.monotonic() > deadline:
                for T in s.contexts:
                    doc.rows.append(self._row(task, T, where, status="skipped",
                                              error=f"time budget of {s.time_budget_s:.0f} s spent before this ran"))
                continue
            self._run_task(task, store, refs, doc, where, meter, bw, deadline)
            self._publish(doc)
        if s.sms:  # last: the Orin-shaped rows reuse the reference tokens and leave the whole-GPU rows undisturbed
            from edgekit.bench.partition_run import PartitionRuns

            try:
                PartitionRuns(s, device, where, self.log, self._publish, deadline).run(doc, store, refs, self._shapes)
            except Exception as e:  # noqa: BLE001 - rows recorded so far stand; the report says where it stopped
                traceback.print_exc()
                self.log(f"--sms rows stopped: {_short(e)}")
                doc.notes.append(f"--sms rows stopped early: {_short(e)}")
        store.drop()
        if meter is not None:
            meter.close()
        return self._publish(doc)

    def _publish(self, doc: BenchDocument) -> BenchDocument:
        doc.elapsed_s = time.monotonic() - self._t_start
        docm.finish(doc, self._shapes)
        self.on_update(doc)
        return doc

    def _row(self, task: _Task, T: int, where: str, **kw) -> Row:
        return Row(model=task.spec, precision=task.precision, engine=task.engine, engine_label=ENGINE_LABELS[task.engine],
                   context=T, measured_on=where, **kw)

    def _run_task(self, task, store, refs, doc, where, meter, bw, deadline) -> None:
        s, device = self.settings, store.device
        if task.engine == "llama.cpp":
            store.drop()  # llama.cpp is another process: leave it the GPU's memory
            for row in llama_rows(s, task.spec, self._llama_files[task.spec], where, self.log):
                doc.rows.append(row)
            doc.models.setdefault(task.spec, {})["gguf_files"] = {k: str(p) for k, p in self._llama_files[task.spec].items()}
            return
        self.log(f"{task.spec} {task.precision} {task.engine}: setting up")
        engine = None
        try:
            cfg, _, info = store.master(task.spec)
            doc.models.setdefault(task.spec, info)
            self._shapes[task.spec] = info["shape_of"]
            if s.max_seq_len > cfg.max_position_len:
                raise BenchmarkError(f"{task.spec}: contexts up to {max(s.contexts)} + new tokens need {s.max_seq_len} "
                                     f"positions; the model has {cfg.max_position_len}")
            keys = [(task.spec, task.precision, T) for T in s.contexts]
            weights = None
            if task.engine in ("edgekit", "edgekit-fused", "compile") or any(k not in refs for k in keys):
                weights = store.on_device(task.spec, task.precision)
            for k in keys:  # the reference path's tokens, computed before an engine holds memory
                if k not in refs:
                    refs[k] = reference_run(cfg, weights, _prompt(cfg, k[2], s.seed, device), s.check_tokens)
            if task.engine == "edgekit":
                engine = RuntimeEngine(cfg, weights, s.max_seq_len, s.new_tokens)
            elif task.engine == "edgekit-fused":
                from edgekit.bench.fused_engine import FusedRuntimeEngine

                engine = FusedRuntimeEngine(cfg, weights, s.max_seq_len, s.new_tokens)
            elif task.engine == "compile":
                doc.settings["inductor_flags"] = apply_inductor_flags()
                engine = CompiledReferenceEngine(cfg, weights, s.max_seq_len, s.new_tokens)
            else:
                from edgekit.bench.hf_twin import build_hf_model

                store.drop()  # the twin holds its own copy: keep the device to one model's weights
                if task.engine == "hf-compile":
                    doc.settings["inductor_flags"] = apply_inductor_flags()
                _, w16, _ = store.master(task.spec)
                engine = HFGenerateEngine(build_hf_model(cfg, w16, device, torch.float16), compiled=task.engine == "hf-compile")
                weights = w16  # the host master: same shapes and dtypes, for the roofline's byte count
        except Exception as e:  # noqa: BLE001 - a failed setup is this task's result, not the run's end
            self.log(f"  setup failed: {_short(e)}")
            traceback.print_exc()
            for T in s.contexts:
                doc.rows.append(self._row(task, T, where, status="failed", error=f"setup: {_short(e)}"))
            return
        try:
            for T in s.contexts:
                if deadline is not None and time.monotonic() > deadline:
                    doc.rows.append(self._row(task, T, where, status="skipped",
                                              error=f"time budget of {s.time_budget_s:.0f} s spent before this ran"))
                    continue
                row = self._row(task, T, where)
                if task.engine.startswith("hf"):
                    row.engine_label = f"{ENGINE_LABELS[task.engine]} [{engine.how}]"
                prompt = _prompt(cfg, T, s.seed, device)
                try:
                    if device.type == "cuda":
                        sync(device)
                        row.resident_bytes_at_start = torch.cuda.memory_allocated(device)
                        torch.cuda.reset_peak_memory_stats(device)
                    measure = measure_generate if task.engine.startswith("hf") else measure_stepped
                    got = measure(engine, prompt, s, meter, row)
                    if device.type == "cuda":
                        row.peak_memory_bytes = torch.cuda.max_memory_allocated(device)
                    _check_tokens(row, got, refs[(task.spec, task.precision, T)])
                    _roofline(cfg, weights, row, T, bw)
                    self.log(f"  ctx {T}: decode {row.decode_tokens_per_s:.1f} tok/s, TTFT {row.ttft_ms:.2f} ms"
                             + ("" if row.tokens_match else f"  TOKENS DIFFER FROM THE REFERENCE at {row.first_mismatch}"))
                except Exception as e:  # noqa: BLE001 - e.g. transformers' CUDA-graph failure: record it
                    self.log(f"  ctx {T}: failed: {_short(e)}")
                    traceback.print_exc()
                    row.status, row.error = "failed", _short(e)
                doc.rows.append(row)
                self._publish(doc)
        finally:
            engine.close()
            del engine
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()


# --------------------------------------------------------------------------- llama.cpp (a subprocess on the same files)
_F16 = "F16"


@contextmanager
def llama_files(s: BenchSettings, log: Callable[[str], None]):
    """spec -> {file type: GGUF path} for the llama.cpp baseline ({} without it), alive for the run.

    A preset's files are written here (F16, then llama-quantize's copies); a .gguf model is its own file.
    """
    from edgekit.bench.llamacpp import USER_FILE, preset_files, resolve_binary
    from edgekit.model.loader import resolve_model_spec
    from edgekit.model.presets import preset_config

    if "llama.cpp" not in s.baselines:
        yield {}
        return
    tmp = None
    if s.gguf_dir:
        workdir = Path(s.gguf_dir)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="edgekit-bench-gguf-")
        workdir = Path(tmp.name)
    quantize = resolve_binary(s.llama_quantize, "llama-quantize", "--llama-quantize") if s.llama_quantize else None
    try:
        files = {}
        for spec in s.models:
            kind, location = resolve_model_spec(spec)
            if kind == "preset":
                t = time.monotonic()
                files[spec] = preset_files(preset_config(location), spec, workdir, s.seed, quantize)
                log(f"{spec}: wrote {', '.join(p.name for p in files[spec].values())} in {time.monotonic() - t:.1f} s")
            else:
                files[spec] = {USER_FILE: Path(location)}
        yield files
    finally:
        if tmp is not None:
            tmp.cleanup()


def llama_rows(s: BenchSettings, spec: str, files: dict[str, Path], where: str, log: Callable[[str], None]) -> list[Row]:
    """llama.cpp's rows for one model: every file at every context, or failed rows that say why."""
    from edgekit.bench.llamacpp import measure_files, resolve_binary

    def row(kind: str, T: int, **kw) -> Row:
        return Row(model=spec, precision=kind, engine="llama.cpp", engine_label=ENGINE_LABELS["llama.cpp"], context=T,
                   measured_on=f"{where}, llama-bench subprocess", **kw)

    log(f"{spec} llama.cpp: llama-bench on {', '.join(p.name for p in files.values())}")
    try:
        binary = resolve_binary(s.llama_bench, "llama-bench", "--llama-bench")
        found, commands = measure_files(binary, files, s.contexts, s.new_tokens, s.repeats)
    except EdgekitError as e:
        log(f"  llama.cpp failed: {e.message}")
        return [row(kind, T, status="failed", error=_short(e)) for kind in files for T in s.contexts]
    out = []
    for m in found:
        r = row(m.kind, m.context, new_tokens=s.new_tokens, decode_tokens_per_s=m.decode_tokens_per_s,
                decode_ms_per_token=1000 / m.decode_tokens_per_s,
                baseline_detail={"file": m.file, "decode_stdev_tokens_per_s": m.decode_stdev, "build": m.build, "gpu": m.gpu,
                                 "commands": commands})
        if m.prefill_tokens_per_s:
            r.prefill_tokens_per_s, r.ttft_ms = m.prefill_tokens_per_s, 1000 * m.context / m.prefill_tokens_per_s
            r.prefill_note = f"llama-bench pp{m.context} at depth 0 (its prompt-processing time, not a full request)"
        log(f"  {m.kind} ctx {m.context}: decode {m.decode_tokens_per_s:.1f} tok/s")
        out.append(r)
    return out
