"""The top-level quantization step that `edgekit quantize` and the build call.

    result = quantize_model(loaded, mode="w8a16")      # or "w8a8", kv_int8=True, ...
    write_quantized(out_dir, result)                    # edgekit.quant.io

Steps: calibrate (only when W8A8 smoothing or the INT8 KV cache needs
activation ranges) -> quantize every linear layer per output channel (W8A8:
after SmoothQuant) -> run the accuracy gate on held-out text -> if it fails,
rank the layers by sensitivity and either stop with a report
(``GateFailedError``) or, with ``allow_mixed``, put the most sensitive layers
back to floating point until the gate passes. Floating-point tensors of the
result (embeddings, norms, biases, layers kept in FP) hold the values they
will have once stored as ``storage_dtype`` (FP16), so the gate scores exactly
what gets written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from edgekit.errors import QuantizationError
from edgekit.measured_on import measured_on
from edgekit.kernels.linear import LinearWeights
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import Decoder, ModelWeights
from edgekit.model.embedding import QuantizedEmbedding, tied_embedding
from edgekit.model.loader import LoadedModel
from edgekit.quant import corpus
from edgekit.quant.calibration import CalibrationStats, calibrate
from edgekit.kernels.dispatch import DispatchTable
from edgekit.precision_names import name_of_quant_mode
from edgekit.cache import BuildCache
from edgekit.quant.gate import EvalText, GateConfig, GateFailedError, build_reference, check, evaluate
from edgekit.quant.reference_cache import cached_reference
from edgekit.quant.self_generated import interleave, passage_prompts, sample_sequences
from edgekit.quant.int4_calibration import Int4Calibration, Int4Options, calibrate_int4
from edgekit.model.kv_int8 import KVScales, make_decoder
from edgekit.quant.mixed import fallback_attempts
from edgekit.model.layers import HEAD, dtype_name, named_linears, with_layers
from edgekit.quant.layers import precision_of, round_through
from edgekit.quant.progress import SILENT, Steps
from edgekit.quant.sensitivity import rank_layers
from edgekit.quant.smoothquant import smoothing_factors
from edgekit.quant.stored_bytes import head_embedding_summary, model_bytes
from edgekit.quant.weights import quantize_linear

MODES = ("w8a16", "w8a8", "w4a16")
# Records a lossless intake makes that quantization passes through untouched (W4A16 ones pass through the INT4
# path; edgekit.quant.int4_calibration).
LOSSLESS_OPS = ("linear_w8a16_grouped",)
REPORT_FORMAT = "edgekit-quant-report"
REPORT_VERSION = 1


@dataclass
class QuantizeOptions:
    """Everything besides the model and the gate thresholds that changes the result."""

    alpha: float = 0.5  # SmoothQuant migration strength (W8A8 only)
    # The LM head stays FP16 by default, as the planner assumes (PrecisionPlan.lm_head): it is
    # the most sensitive layer of SmolLM2-135M under W8A16 (rank 1 of 121, measured on CPU).
    # Quantized in a tied model, the head's quantized matrix is the embedding too (no FP16 copy is
    # kept: edgekit.model.embedding), and the gate scores both uses of it.
    quantize_head: bool = False
    # The head's scheme when quantized: None = the mode's ("w4a16" -> INT4, else INT8); "w8a16" keeps an INT4
    # model's head in INT8 (per-row scales), the finer grid for the most sensitive layer.
    head_scheme: str | None = None
    storage_dtype: torch.dtype = torch.float16  # of every tensor that stays floating point
    calibration_tokens: int = 2048
    calibration_window_len: int = 256
    sensitivity_tokens: int = 128  # calibration tokens each layer's sensitivity is measured on
    always_rank: bool = False  # rank layers even when the gate passes
    max_fp_fraction: float = 0.25  # mixed precision gives up beyond this share of layers in FP
    # W4A16 (mode "w4a16"): group size (the largest supported group dividing a layer's K where it does not divide),
    # symmetric codes (Q4_0 form) or with offsets (Q4_1 form), and the calibration method
    # (edgekit.quant.int4_calibration.METHODS: "gptq", "awq", "awq_gptq", "rtn").
    # The default, GPTQ onto group scales/offsets searched under H (static groups) with strong dampening, is the
    # best all-INT4 recipe measured on the default model (scripts/eval_int4_calibration.py, CPU, held-out text,
    # g128/g64): +8.0% perplexity, where GPTQ with min-max groups and 0.01 dampening gave +15.5%, the search with
    # plain rounding +9.5% and plain rounding +50%. Weak dampening lets GPTQ's column updates fit the 2048
    # calibration tokens (with the search, damp 0.1 / 0.5 / 0.9: +9.1% / +8.0% / +8.3%; without, 0.01 / 0.1:
    # +15.5% / +13.8%). Norm tweaking after rounding (the RMSNorm weights tuned end to end towards the FP logits,
    # 48 Adam steps on the calibration windows) takes it to +5.7% perplexity, greedy agreement 93.6% -> 93.9%,
    # logits SNR 15.6 -> 15.7 dB, for 2.7 extra CPU-minutes (88 -> 250 s); tuning the INT4 rows' scale factors as
    # well reaches +3.3% but worsens the held-out KL and SNR (0.086 -> 0.106 nats, 13.1 dB): opt-in
    # (int4_tuning_rows).
    int4_group: int = 128
    int4_symmetric: bool = False
    int4_method: str = "gptq"
    int4_damp: float = 0.5  # GPTQ dampening, a fraction of mean(diag H)
    int4_act_order: bool = False  # GPTQ columns by decreasing diag H (static groups)
    int4_group_search: bool = True  # group scale/offset searched and refitted (edgekit.quant.int4_group_search)
    int4_true_sequential: bool = False  # each projection calibrated on inputs through the block's rounded earlier ones
    # Adam steps of norm tweaking after rounding: the RMSNorm weights tuned end to end towards the FP model's logits,
    # the INT4 records left as rounded (edgekit.quant.int4_tuning); 0 = off
    int4_tuning_steps: int = 48
    int4_tuning_rows: bool = False  # norm tweaking tunes the INT4 projections' row factors too (measured: overfits)
    # Norm tweaking's data: this many sequences (calibration_window_len tokens each) sampled from the FP model from
    # the first tokens of the calibration passages (edgekit.quant.self_generated), interleaved with the calibration
    # windows; 0 = the calibration windows alone. The seed makes the sample reproducible.
    int4_tuning_generated: int = 0
    int4_tuning_seed: int = 0
    # Early stopping of norm tweaking on calibration text it never sees: at most this many tokens of the calibration
    # file after the first calibration_tokens (never the held-out text, the gate's); 0 = none.
    # Both measured on the default model (CPU; gptq+search+tune=48+gen=32+val=1024): +6.65% perplexity, 93.9% greedy,
    # held-out KL 0.0850 (the default: +5.73%, 93.9%, 0.0842) for 543 s of calibration: opt-in (edgekit.quant.int4_tuning).
    int4_tuning_validation_tokens: int = 0

    def int4_options(self) -> Int4Options:
        return Int4Options(group=self.int4_group, symmetric=self.int4_symmetric, method=self.int4_method,
                           damp=self.int4_damp, act_order=self.int4_act_order, group_search=self.int4_group_search,
                           true_sequential=self.int4_true_sequential,
                           tuning_steps=self.int4_tuning_steps, tuning_rows=self.int4_tuning_rows)


@dataclass
class QuantizationResult:
    config: ModelConfig
    weights: ModelWeights  # quantized; FP parts hold their storage-dtype values
    kv_scales: KVScales | None
    report: dict
    layer_precisions: dict[str, str] = field(default_factory=dict)  # layer -> "w4a16" | "w8a16" | "w8a8" | "fp16"

    def decoder(self, ops=None) -> Decoder:
        """A decoder running this model through ``ops`` (default: the reference dispatch table)."""
        return make_decoder(self.config, self.weights, ops, self.kv_scales)


def heldout_eval_text(loaded: LoadedModel, cfg: GateConfig, text: str | None = None) -> EvalText:
    """Perplexity windows and greedy prompts from the shipped held-out text (or ``text``)."""
    text = corpus.shipped_text(corpus.HELDOUT_FILE) if text is None else text
    ids = corpus.tokenize(text, loaded.tokenizer, loaded.config.vocab_size)
    return EvalText(
        windows=corpus.windows(ids, cfg.window_len, cfg.ppl_tokens),
        prompts=corpus.prompts(text, loaded.tokenizer, loaded.config.vocab_size, cfg.n_prompts, cfg.prompt_len),
    )


def calibration_ids(loaded: LoadedModel) -> list[int]:
    """The shipped calibration text as the model's token ids."""
    return corpus.tokenize(corpus.shipped_text(corpus.CALIBRATION_FILE), loaded.tokenizer, loaded.config.vocab_size)


def calibration_windows(loaded: LoadedModel, tokens: int, window_len: int) -> list[torch.Tensor]:
    return corpus.windows(calibration_ids(loaded), window_len, tokens)


def quantize_layers(
    fp_weights: ModelWeights, mode: str, stats: CalibrationStats | None, alpha: float, include_head: bool,
    skip: frozenset[str] = frozenset(),
) -> dict[str, LinearWeights]:
    """INT8 records for every linear layer (and the head when ``include_head``) except those in ``skip``."""
    out = {}
    for name, lw in named_linears(fp_weights).items():
        if (name == HEAD and not include_head) or name in skip or lw.op in LOSSLESS_OPS:
            continue  # a lossless intake (a GGUF Q8_0 table as grouped INT8) stays as it came in
        smooth = None
        if mode == "w8a8":
            if stats is None or name not in stats.act_absmax:
                raise QuantizationError(f"{name}: W8A8 needs calibration statistics for this layer, found none")
            smooth = smoothing_factors(stats.act_absmax[name], lw.weight, alpha)
        out[name] = quantize_linear(lw, mode, name, smooth)
    return out


def _stored_fp(fp_weights: ModelWeights, dt: torch.dtype) -> ModelWeights:
    """A copy of the FP model whose float tensors hold their values after storage as ``dt``."""

    def lin(lw: LinearWeights) -> LinearWeights:  # an INT4 record passed through keeps its codes, scales and offsets
        return replace(lw, weight=round_through(lw.weight, dt), bias=round_through(lw.bias, dt))

    if isinstance(fp_weights.tok_embeddings, QuantizedEmbedding):  # a tied table taken in quantized: kept as it is
        head = lin(fp_weights.lm_head)
        emb = tied_embedding(head, fp_weights.tok_embeddings.dtype)
    else:
        emb = round_through(fp_weights.tok_embeddings, dt)
        tied = fp_weights.lm_head.weight is fp_weights.tok_embeddings
        head = LinearWeights("linear", emb, round_through(fp_weights.lm_head.bias, dt)) if tied else lin(fp_weights.lm_head)
    blocks = [
        replace(b, **{k: round_through(t, dt) for k, t in b.norms().items()},
                **{k: lin(lw) for k, lw in b.linears().items()})
        for b in fp_weights.blocks
    ]
    return ModelWeights(tok_embeddings=emb, blocks=blocks, norm=round_through(fp_weights.norm, dt), lm_head=head)


def _assemble(stored_fp: ModelWeights, quantized: dict[str, LinearWeights], fp_layers: set[str], dt: torch.dtype) -> ModelWeights:
    """The stored FP model with every quantized layer swapped in except ``fp_layers``; biases rounded like the rest."""
    chosen = {}
    for name, lw in quantized.items():
        if name in fp_layers:
            continue
        chosen[name] = replace(lw, bias=round_through(lw.bias, dt))
    return with_layers(stored_fp, chosen)


def _layer_precisions(weights: ModelWeights, dt: torch.dtype) -> dict[str, str]:
    return {name: precision_of(lw, dtype_name(dt)) for name, lw in named_linears(weights).items()}


@dataclass
class PreparedQuantization:
    """Every layer quantized, before the gate decides which of them to use."""

    config: ModelConfig
    layers: dict[str, LinearWeights]  # layer -> its quantized record (W4A16: INT8 where a layer cannot be INT4)
    stored_fp: ModelWeights  # the FP model (W4A16: with AWQ scales folded) rounded through the storage dtype
    storage_dtype: torch.dtype
    stats: CalibrationStats | None
    kv_scales: KVScales | None
    fallback: dict[str, LinearWeights] = field(default_factory=dict)  # W4A16: layer -> the INT8 record to fall back to
    int4: Int4Calibration | None = None
    # W4A16 with norm tweaking kept: the same preparation without it, where a mixed-precision fallback starts
    untuned: "PreparedQuantization | None" = None

    def assemble(self, fp_layers=(), int8_layers=()) -> ModelWeights:
        """The quantized model with the named layers left in floating point (and, W4A16, others in INT8)."""
        chosen = {**self.layers, **{n: self.fallback[n] for n in int8_layers}}
        return _assemble(self.stored_fp, chosen, set(fp_layers), self.storage_dtype)

    def candidates(self) -> dict[str, LinearWeights]:
        """The layers whose precision the gate may lower: every quantized one, or the new INT4 ones for W4A16."""
        if self.int4 is None:
            return self.layers
        return {n: lw for n, lw in self.layers.items() if n in self.int4.layers}

    def decoder(self, fp_layers=(), ops=None) -> Decoder:
        return make_decoder(self.config, self.assemble(fp_layers), ops, self.kv_scales)


def prepare_quantization(
    loaded: LoadedModel, mode: str, *, kv_int8: bool = False, options: QuantizeOptions | None = None, steps: Steps = SILENT
) -> PreparedQuantization:
    """Calibrate (when W8A8 or the INT8 KV cache needs activation ranges) and quantize every layer; no gate."""
    if mode not in MODES:
        raise QuantizationError(f"unknown quantization mode {mode!r}; expected one of {', '.join(MODES)}")
    opts = options or QuantizeOptions()
    if opts.head_scheme is not None:
        allowed = ("w8a16", "w4a16") if mode == "w4a16" else (mode,)
        if opts.head_scheme not in allowed:
            raise QuantizationError(f"head scheme {opts.head_scheme!r} with mode {mode}; expected one of {', '.join(allowed)}",
                                    hint="an INT4 model's head may be INT8 or INT4; an INT8 model's head is INT8")
        if not opts.quantize_head:
            raise QuantizationError(f"a head scheme ({opts.head_scheme}) was given but the head is not quantized",
                                    hint="set quantize_head (--quantize-head) as well")
    if loaded.weights is None:
        raise QuantizationError(f"{loaded.source.location}: the model was loaded without weights", hint="load it with weights=True")
    cfg, fp_weights = loaded.config, loaded.weights.to(dtype=torch.float32)
    if mode == "w4a16":
        return _prepare_int4(loaded, fp_weights, kv_int8, opts, steps)
    stats = None
    if mode == "w8a8" or kv_int8:
        stats = calibrate(cfg, fp_weights, calibration_windows(loaded, opts.calibration_tokens, opts.calibration_window_len), steps)
    return PreparedQuantization(
        config=cfg,
        layers=quantize_layers(fp_weights, mode, stats, opts.alpha, opts.quantize_head),
        stored_fp=_stored_fp(fp_weights, opts.storage_dtype),
        storage_dtype=opts.storage_dtype,
        stats=stats,
        kv_scales=KVScales.from_absmax(stats.k_absmax, stats.v_absmax) if kv_int8 else None,
    )


def _prepare_int4(loaded: LoadedModel, fp_weights: ModelWeights, kv_int8: bool, opts: QuantizeOptions,
                  steps: Steps) -> PreparedQuantization:
    """W4A16: calibrated INT4 records, INT8 ones of the same (AWQ-folded) weights to fall back to; INT4 records
    already in the model (lossless GGUF intake) pass through untouched, with no fallback."""
    windows = calibration_windows(loaded, opts.calibration_tokens, opts.calibration_window_len)
    int4_head = opts.quantize_head and opts.head_scheme in (None, "w4a16")
    tuning, validation = _tuning_data(loaded, fp_weights, opts, windows) if opts.int4_tuning_steps else (None, None)
    cal = calibrate_int4(loaded.config, fp_weights, windows, opts.int4_options(), include_head=int4_head, steps=steps,
                         tuning_windows=tuning, validation_windows=validation)
    prepared = _int4_prepared(loaded, cal, cal.weights, cal.layers, kv_int8, opts, windows, int4_head, steps)
    if cal.untuned is not None:
        prepared.untuned = _int4_prepared(loaded, cal, *cal.untuned, kv_int8, opts, windows, int4_head, steps)
    return prepared


def _tuning_data(loaded: LoadedModel, fp_weights: ModelWeights, opts: QuantizeOptions,
                 windows: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Norm tweaking's windows (the calibration ones, and self-generated sequences with int4_tuning_generated) and its
    validation windows (calibration tokens after the first calibration_tokens, with int4_tuning_validation_tokens)."""
    if not (opts.int4_tuning_validation_tokens or opts.int4_tuning_generated):
        return windows, None  # the default: the calibration windows alone, nothing more to read
    ids = calibration_ids(loaded)
    rest = ids[opts.calibration_tokens:]
    validation = None
    if opts.int4_tuning_validation_tokens and len(rest) >= 2:
        validation = corpus.windows(rest, opts.calibration_window_len, opts.int4_tuning_validation_tokens)
    if not opts.int4_tuning_generated:
        return windows, validation
    seen = ids[:opts.calibration_tokens]  # prompts only from the tuning's own text, never from the validation part
    prompts = passage_prompts(corpus.passages(corpus.shipped_text(corpus.CALIBRATION_FILE)), loaded.tokenizer,
                              loaded.config.vocab_size, seen, opts.int4_tuning_generated)
    fp = Decoder(loaded.config, fp_weights, DispatchTable())
    generated = sample_sequences(fp, prompts, opts.calibration_window_len, opts.int4_tuning_seed)
    return interleave(generated, windows), validation


def _int4_prepared(loaded: LoadedModel, cal: Int4Calibration, fp_weights: ModelWeights,
                   int4_layers: dict[str, LinearWeights], kv_int8: bool, opts: QuantizeOptions,
                   windows: list[torch.Tensor], int4_head: bool, steps: Steps) -> PreparedQuantization:
    # KV ranges of the folded model: folding wo's scales into the V rows changes the values the cache holds.
    stats = calibrate(loaded.config, fp_weights, windows, steps) if kv_int8 else None
    int8 = quantize_layers(fp_weights, "w8a16", None, opts.alpha, opts.quantize_head, frozenset(cal.passed_through))
    int8_head = {HEAD: int8[HEAD]} if opts.quantize_head and not int4_head and HEAD in int8 else {}  # head_scheme "w8a16"
    layers = {**{n: int8[n] for n in cal.skipped}, **int8_head, **int4_layers}
    return PreparedQuantization(
        config=loaded.config, layers=layers, stored_fp=_stored_fp(fp_weights, opts.storage_dtype),
        storage_dtype=opts.storage_dtype, stats=stats,
        kv_scales=KVScales.from_absmax(stats.k_absmax, stats.v_absmax) if kv_int8 else None,
        fallback={n: int8[n] for n in int4_layers}, int4=cal,
    )


def _gentler_precision(mode: str) -> str:
    """The --precision a failed gate's hint points to: the next scheme that quantizes less (a W8A16 failure was
    once told to use W8A16, the precision it had just failed at)."""
    return "--precision fp16 (no quantization)" if mode == "w8a16" else "--precision int8 (W8A16)"


def quantize_model(
    loaded: LoadedModel,
    mode: str = "w8a16",
    *,
    kv_int8: bool = False,
    gate: GateConfig | None = None,
    allow_mixed: bool = False,
    options: QuantizeOptions | None = None,
    eval_text: EvalText | None = None,
    steps: Steps = SILENT,
    reference_cache: BuildCache | None = None,
) -> QuantizationResult:
    """Quantize a loaded FP model, gate it on held-out text, and return the weights with a report.

    Raises GateFailedError (a QuantizationError, with ``.report``) when the gate
    fails and mixed precision is not allowed or cannot rescue it.

    ``reference_cache``: keep the gate's FP reference there by content (edgekit.quant.reference_cache),
    keyed by ``loaded.source``; pass it only for a model loaded unchanged from its source.
    """
    opts = options or QuantizeOptions()
    gate = gate or GateConfig.for_mode(mode)
    gate.validate()
    cfg, fp_weights = loaded.config, loaded.weights.to(dtype=torch.float32)
    dt = opts.storage_dtype
    timings: dict[str, float] = {}
    report: dict = {
        "format": REPORT_FORMAT,
        "format_version": REPORT_VERSION,
        "model": {"name": cfg.name, "source": loaded.source.to_dict()},
        "mode": mode,
        "kv_int8": kv_int8,
        "options": {"alpha": opts.alpha if mode == "w8a8" else None, "quantize_head": opts.quantize_head,
                    "head_scheme": opts.head_scheme,
                    "storage_dtype": dtype_name(dt), "allow_mixed": allow_mixed,
                    **({"int4": {"group": opts.int4_group, "symmetric": opts.int4_symmetric, "method": opts.int4_method,
                                 "damp": opts.int4_damp, "act_order": opts.int4_act_order,
                                 "group_search": opts.int4_group_search,
                                 "true_sequential": opts.int4_true_sequential,
                                 "tuning_steps": opts.int4_tuning_steps, "tuning_rows": opts.int4_tuning_rows,
                                 "tuning_generated": opts.int4_tuning_generated, "tuning_seed": opts.int4_tuning_seed,
                                 "tuning_validation_tokens": opts.int4_tuning_validation_tokens,
                                 "scale_dtype": "fp16"}} if mode == "w4a16" else {})},
        "measured_on": measured_on(fp_weights.tok_embeddings.device),
        "baseline": "the unquantized model as loaded (FP32 weights, FP32 activations, reference operators)",
    }

    # 1-2. calibration (only what needs activation ranges), then every layer quantized
    t = time.perf_counter()
    prepared = prepare_quantization(loaded, mode, kv_int8=kv_int8, options=opts, steps=steps)
    stats, stored_fp, kv_scales = prepared.stats, prepared.stored_fp, prepared.kv_scales
    if stats is not None:
        report["calibration"] = {"text": f"edgekit/quant/data/{corpus.CALIBRATION_FILE}", **stats.summary()}
    elif mode != "w4a16":
        report["calibration"] = {"text": None, "note": "weight-only INT8 with an FP KV cache needs no activation ranges"}
    if prepared.int4 is not None:
        report["calibration"] = {**report.get("calibration", {}), "text": f"edgekit/quant/data/{corpus.CALIBRATION_FILE}",
                                 "int4": prepared.int4.summary()}
    kv_transform = kv_scales.roundtrip if kv_scales is not None else None
    timings["calibrate_and_quantize_s"] = time.perf_counter() - t

    # 3. the gate
    t = time.perf_counter()
    ops = DispatchTable()
    text = eval_text or heldout_eval_text(loaded, gate)
    fp_decoder = Decoder(cfg, fp_weights, ops)
    if reference_cache is not None:
        ref, ref_cached = cached_reference(fp_decoder, text, gate.new_tokens, model_identity=loaded.source.content_identity(),
                                           cache=reference_cache, steps=steps)
    else:
        ref, ref_cached = build_reference(fp_decoder, text, gate.new_tokens, steps), False
    report["gate"] = {"config": gate.to_dict(), "text": "edgekit/quant/data/heldout.txt" if eval_text is None else "caller-provided",
                      "fp_reference": "read from the cache" if ref_cached else "computed"}
    timings["fp_reference_s"] = time.perf_counter() - t

    def attempt(fp_layers: list[str], label: str, int8_layers: list[str] = ()) -> tuple[ModelWeights, dict, list[str]]:
        w = prepared.assemble(fp_layers, int8_layers)
        metrics = evaluate(Decoder(cfg, w, ops), ref, kv_transform, steps, label)
        return w, metrics, check(metrics, gate)

    weights, metrics, fails = attempt([], f"gate: all layers {name_of_quant_mode(mode)}")
    attempts = [{"int8_layers": [], "fp_layers": [], "metrics": metrics, "failures": fails}]
    timings["gate_s"] = time.perf_counter() - t

    if fails and allow_mixed and prepared.untuned is not None:
        # Norm tweaking compensated the all-INT4 model's rounding errors, those of the layers the fallback would now
        # take out of INT4 included (the final norm is not folded): a mixed model starts from the model as rounded.
        prepared = prepared.untuned
        stored_fp, kv_scales = prepared.stored_fp, prepared.kv_scales
        kv_transform = kv_scales.roundtrip if kv_scales is not None else None
        report["gate"]["mixed_from"] = "the INT4 model as rounded, without norm tweaking"

    ranking = None
    if fails or opts.always_rank:
        t = time.perf_counter()
        sens = calibration_windows(loaded, opts.sensitivity_tokens, opts.sensitivity_tokens)
        ranking = rank_layers(cfg, stored_fp, prepared.candidates(), sens, steps)
        report["sensitivity"] = {"text": f"edgekit/quant/data/{corpus.CALIBRATION_FILE}",
                                 "tokens": sum(w.shape[1] for w in sens), "metric": "mean KL(fp || quant), nats/token",
                                 "layers": ranking}
        timings["sensitivity_s"] = time.perf_counter() - t

    if fails and kv_int8:
        # Mixed precision restores linear layers only; measure how much of the damage the INT8 KV cache does alone.
        t = time.perf_counter()
        kv_only = evaluate(Decoder(cfg, stored_fp, ops), ref, kv_transform, steps, "gate: only the KV cache INT8")
        report["gate"]["kv_int8_alone"] = {"metrics": kv_only, "failures": check(kv_only, gate)}
        timings["kv_int8_alone_s"] = time.perf_counter() - t

    if fails and allow_mixed:
        t = time.perf_counter()
        limit = max(1, int(opts.max_fp_fraction * len(prepared.candidates())))
        for a in fallback_attempts([r["layer"] for r in ranking], limit, int4=mode == "w4a16"):
            weights, metrics, fails = attempt(a.fp_layers, a.label, a.int8_layers)
            attempts.append({"int8_layers": a.int8_layers, "fp_layers": a.fp_layers, "metrics": metrics,
                             "failures": fails})
            if not fails:
                break
        timings["mixed_precision_s"] = time.perf_counter() - t

    final = attempts[-1]
    report["gate"].update({"passed": not fails, "metrics": metrics, "failures": fails, "attempts": attempts})
    precisions = _layer_precisions(weights, dt)
    report["layers"] = precisions
    report["fp_layers"] = final["fp_layers"]
    if mode == "w4a16":
        report["int8_layers"] = final["int8_layers"]  # INT4 layers the gate moved to INT8 (not those that cannot be INT4)
    report["mixed_precision"] = bool(final["fp_layers"] or final["int8_layers"])
    report["weight_bytes"] = {"fp32_as_loaded": fp_weights.nbytes(), "quantized": model_bytes(weights, dt)}
    report["head_embedding"] = head_embedding_summary(weights, dt)
    # layers taken in bit for bit from the source file (GGUF Q4_0/Q4_1/Q4_K projections, a Q8_0 table), never re-quantized
    report["lossless_intake"] = sorted({*(prepared.int4.passed_through if prepared.int4 else ()),
                                        *(n for n, lw in named_linears(weights).items() if lw.op in LOSSLESS_OPS)})
    report["kv_cache"] = {"precision": "int8" if kv_int8 else dtype_name(dt),
                          "scales": "static per (block, KV head), from calibration" if kv_int8 else None}
    report["timings_s"] = timings

    if fails:
        worst = ", ".join(f"{r['layer']} (KL {r['kl_nats']:.2e})" for r in ranking[:5])
        why = "; ".join(fails)
        if allow_mixed:
            kept = f"{len(final['fp_layers'])} most sensitive layers in floating point"
            if final["int8_layers"]:
                kept += f" and {len(final['int8_layers'])} more in INT8"
            msg = (f"the {name_of_quant_mode(mode)} model fails the accuracy gate even with the {kept}: {why}; "
                   f"most sensitive layers: {worst}")
            hint = f"relax the gate thresholds, raise the mixed-precision limit, or use {_gentler_precision(mode)}"
        else:
            msg = f"the {name_of_quant_mode(mode)} model fails the accuracy gate: {why}; the layers that hurt most: {worst}"
            hint = ("pass --allow-mixed to move the most sensitive layers to INT8 (then floating point), "
                    if mode == "w4a16" else
                    "pass --allow-mixed to keep the most sensitive layers in floating point, ") + f"or use {_gentler_precision(mode)}"
        if kv_int8 and report["gate"]["kv_int8_alone"]["failures"]:
            msg += "; the INT8 KV cache alone already fails the gate"
            hint = "drop --kv-int8"
        raise GateFailedError(msg, report, hint=hint)
    return QuantizationResult(cfg, weights, kv_scales, report, precisions)
