"""Calibrated INT4 (W4A16) weights for a whole model, one decoder block at a time.

    cal = calibrate_int4(config, fp_weights, windows, Int4Options(group=128, method="gptq"))
    cal.weights   # the FP model with AWQ scales folded in (same function, FP32)
    cal.layers    # layer -> linear_w4a16 record, for every layer that can be INT4

Block by block, on the calibration windows:
1. run the block in floating point and collect, for each of its projections,
   H = X^T X of its inputs and the mean |x| of every input channel;
2. "awq", "awq_gptq": search per-input-channel scales (edgekit.quant.awq) and
   fold them into the block (edgekit.quant.awq_fold), so the FP model is
   unchanged and H becomes that of the scaled inputs;
3. round every projection: "rtn" round-to-nearest, "awq" round-to-nearest of
   the scaled weights with per-group clip ratios searched under H, "gptq" and
   "awq_gptq" GPTQ (edgekit.quant.gptq); with ``group_search`` the groups'
   scales and offsets are searched and refitted under H first
   (edgekit.quant.int4_group_search) and every method rounds onto them;
   with ``true_sequential`` the block's projections are rounded in order
   (wqkv, wo, w_gate_up, w_down), each on inputs recorded afresh through the
   already-rounded earlier ones;
4. run the block again with its rounded projections: its output is the next
   block's input, so later blocks are calibrated on the inputs they will see
   once the earlier ones are quantized (GPTQ's sequential order).

The group is the requested one where it divides the layer's input width, else
the largest supported group that does (SmolLM2-135M: K = 576 takes G = 64 when
128 is asked); a layer with K not a multiple of 32 cannot be INT4 and is left
out of ``layers`` with the reason in ``skipped``. Records that are already
``linear_w4a16`` (a 4-bit GGUF taken in losslessly) are passed through
untouched and listed in ``passed_through``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from edgekit.errors import QuantizationError
from edgekit.kernels.dispatch import DispatchTable
from edgekit.kernels.int4_layout import GROUP_SIZES
from edgekit.kernels.linear import LinearWeights
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import Decoder, ModelWeights
from edgekit.quant.awq import scaled_hessian, search_scales
from edgekit.quant.awq_fold import can_fold, fold_scales, wo_expand
from edgekit.quant.calibration import RecordingOps
from edgekit.quant.forward import embed, logits, run_blocks
from edgekit.quant.gptq import gptq_quantize
from edgekit.quant.int4_tuning import Tuning, tune_floats
from edgekit.quant.int4_group_search import search_group_params
from edgekit.quant.int4_rounding import output_error, params_record, rtn_record, search_clip
from edgekit.model.layers import BLOCK_LINEARS, HEAD
from edgekit.quant.progress import SILENT, Steps

METHODS = ("gptq", "awq", "awq_gptq", "rtn")


@dataclass
class Int4Options:
    group: int = 128
    symmetric: bool = False
    method: str = "gptq"
    scale_dtype: torch.dtype = torch.float16
    damp: float = 0.01  # GPTQ dampening, a fraction of mean(diag H)
    act_order: bool = False  # GPTQ: columns in decreasing order of diag H, with static groups
    # group scales/offsets searched among candidates and refitted by least squares under H
    # (edgekit.quant.int4_group_search); GPTQ then keeps them fixed (static groups)
    group_search: bool = False
    # quantize a block's projections in order (wqkv, wo, w_gate_up, w_down), each calibrated on inputs that come
    # through the block's already-rounded earlier projections, instead of all on the block's FP inputs
    true_sequential: bool = False
    # Adam steps of norm tweaking once every projection is rounded: the RMSNorm weights tuned end to end towards the
    # FP model's logits (edgekit.quant.int4_tuning); 0 = off
    tuning_steps: int = 0
    tuning_rows: bool = False  # norm tweaking tunes each INT4 row's factor too

    def validate(self) -> None:
        if self.method not in METHODS:
            raise QuantizationError(f"unknown INT4 method {self.method!r}; expected one of {', '.join(METHODS)}")
        if self.group not in GROUP_SIZES:
            raise QuantizationError(f"INT4 group size {self.group} is not supported; expected one of {GROUP_SIZES}")
        if not 0 < self.damp < 1:
            raise QuantizationError(f"GPTQ damping must be in (0, 1) (a fraction of mean(diag H)), got {self.damp}")
        if self.tuning_steps < 0:
            raise QuantizationError(f"tuning steps must be >= 0 (0 = off), got {self.tuning_steps}")


@dataclass
class Int4Calibration:
    weights: ModelWeights  # the FP model with AWQ scales folded in
    layers: dict[str, LinearWeights]  # layer -> linear_w4a16 record (new ones only)
    groups: dict[str, int] = field(default_factory=dict)  # layer -> group size used
    passed_through: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # layer -> why it cannot be INT4
    errors: dict[str, dict] = field(default_factory=dict)  # layer -> output errors on the calibration inputs
    tuning: dict = field(default_factory=dict)  # norm tweaking: KL on the calibration windows before / after
    untuned: tuple[ModelWeights, dict[str, LinearWeights]] | None = None  # (weights, layers) as rounded, if tuning kept
    n_tokens: int = 0

    def summary(self) -> dict:
        return {"tokens": self.n_tokens, "groups": self.groups, "passed_through": self.passed_through,
                "not_int4": self.skipped, "output_error_vs_rtn": self.errors,
                **({"tuning": self.tuning} if self.tuning else {})}


def group_for(k: int, requested: int) -> int | None:
    """The requested group if it divides K, else the largest supported smaller one that does; None if none does."""
    fits = [g for g in GROUP_SIZES if g <= requested and k % g == 0]
    return max(fits) if fits else None


class _InputStats:
    """H = sum X^T X (FP64) and sum |x| per input channel for each recorded layer."""

    def __init__(self):
        self.h: dict[str, torch.Tensor] = {}
        self.abs_sum: dict[str, torch.Tensor] = {}
        self.rows: dict[str, int] = {}

    def record(self, name: str, x: torch.Tensor) -> None:
        x2 = x.reshape(-1, x.shape[-1]).to(torch.float32)  # (rows, K)
        h = (x2.T @ x2).to(torch.float64)
        self.h[name] = h if name not in self.h else self.h[name] + h
        a = x2.abs().sum(0).to(torch.float64)
        self.abs_sum[name] = a if name not in self.abs_sum else self.abs_sum[name] + a
        self.rows[name] = self.rows.get(name, 0) + x2.shape[0]

    def forget(self, name: str) -> None:
        for d in (self.h, self.abs_sum, self.rows):
            d.pop(name, None)

    def mean_abs(self, name: str) -> torch.Tensor:
        return (self.abs_sum[name] / self.rows[name]).to(torch.float32)


def _batches(windows: list[torch.Tensor]) -> list[torch.Tensor]:
    """Windows of equal length stacked into (B, T) batches: a block reads its weights once per batch."""
    by_len: dict[int, list[torch.Tensor]] = {}
    for w in windows:
        by_len.setdefault(w.shape[1], []).append(w)
    return [torch.cat(ws, dim=0) for ws in by_len.values()]


def _record_block(dec: Decoder, ops, i: int, block, names: list[str], xs: list[torch.Tensor],
                  stats: "_InputStats") -> None:
    """Run block i as ``block`` on the batches ``xs`` and record (afresh) the inputs of the layers ``names``."""
    for n in names:
        stats.forget(n)
    saved = dec.weights.blocks[i]
    dec.weights.blocks[i] = block
    by_id = {id(getattr(block, n.split(".")[-1])): n for n in names}
    rec = dec.with_ops(RecordingOps(ops, by_id, stats.record))
    try:
        for x in xs:
            run_blocks(rec, x, i, i + 1)
    finally:
        dec.weights.blocks[i] = saved


def _round_layer(lw: LinearWeights, h: torch.Tensor, group: int, opts: Int4Options, name: str) -> LinearWeights:
    w = lw.weight.to(torch.float32)
    if opts.method == "rtn" and not opts.group_search:
        return rtn_record(w, lw.bias, group, opts.symmetric, opts.scale_dtype)
    params = search_group_params(w, h, group, opts.symmetric, opts.scale_dtype) if opts.group_search else None
    if opts.method in ("rtn", "awq"):
        if params is None:  # AWQ's clip search (the sub-block search includes the same clip ratios)
            clip = search_clip(w, h.to(torch.float32), group, opts.symmetric, opts.scale_dtype)
            return rtn_record(w, lw.bias, group, opts.symmetric, opts.scale_dtype, clip)
        return params_record(w, lw.bias, *params, opts.scale_dtype)
    return gptq_quantize(w, h, group, symmetric=opts.symmetric, scale_dtype=opts.scale_dtype, damp=opts.damp,
                         act_order=opts.act_order, bias=lw.bias, name=name, group_params=params)


def _awq_block_scales(block, config: ModelConfig, stats: _InputStats, prefix: str, groups: dict[str, int],
                      opts: Int4Options) -> dict[str, torch.Tensor]:
    scales = {}
    for k in BLOCK_LINEARS:
        name = f"{prefix}.{k}"
        if name not in groups or not can_fold(block, k):
            continue
        lw = getattr(block, k)
        act, expand = stats.mean_abs(name), None
        if k == "wo":  # one scale per V channel: the mean over the heads that read it
            expand = wo_expand(config)
            act = torch.zeros(config.kv_size).index_add_(0, expand, act) / (config.n_heads // config.n_kv_heads)
        s, _ = search_scales(lw.weight, stats.h[name], act, groups[name], opts.symmetric, opts.scale_dtype, expand)
        scales[k] = s
    return scales


@torch.no_grad()
def calibrate_int4(config: ModelConfig, fp_weights: ModelWeights, token_windows: list[torch.Tensor],
                   opts: Int4Options, *, include_head: bool = False, steps: Steps = SILENT,
                   tuning_windows: list[torch.Tensor] | None = None,
                   validation_windows: list[torch.Tensor] | None = None) -> Int4Calibration:
    """Calibrated INT4 records for every projection (and the LM head when ``include_head``); see the module doc.

    Norm tweaking (``opts.tuning_steps``) visits ``tuning_windows`` (default: ``token_windows``) and, given
    ``validation_windows``, stops early on them (edgekit.quant.int4_tuning.tune_floats)."""
    opts.validate()
    if not token_windows:
        raise QuantizationError("INT4 calibration needs at least one window of tokens, got none")
    work = ModelWeights(fp_weights.tok_embeddings, list(fp_weights.blocks), fp_weights.norm, fp_weights.lm_head)
    ops = DispatchTable()
    dec = Decoder(config, work, ops)
    cal = Int4Calibration(weights=work, layers={})
    xs = [embed(dec, b) for b in _batches(token_windows)]  # [(B, T, C)]
    cal.n_tokens = sum(w.numel() for w in token_windows)

    def plan(name: str, lw: LinearWeights) -> int | None:
        if lw.op in ("linear_w4a16", "linear_w8a16_grouped"):  # lossless intakes (GGUF Q4_*, a Q8_0 table)
            cal.passed_through.append(name)
            return None
        if lw.op != "linear":
            raise QuantizationError(f"{name}: is {lw.op}; expected a floating-point layer or an INT4 one to pass through")
        g = group_for(lw.in_features, opts.group)
        if g is None:
            cal.skipped[name] = f"in_features={lw.in_features} is not a multiple of {min(GROUP_SIZES)}"
        return g

    block_groups = [{f"blocks.{i}.{k}": g for k, lw in b.linears().items() if (g := plan(f"blocks.{i}.{k}", lw))}
                    for i, b in enumerate(work.blocks)]
    head_rounded = include_head and work.lm_head.op == "linear"
    with steps.task(f"INT4 calibration ({opts.method})", config.n_layers + int(include_head)) as advance:
        for i in range(config.n_layers):
            prefix = f"blocks.{i}"
            block = work.blocks[i]
            groups = block_groups[i]
            if not groups:
                # every projection passes through (a GGUF's Q4 nibbles): nothing to record or round here; the
                # activations move on only if a later layer is calibrated (a Q4_1 file ran 81 s of passes for nothing)
                if head_rounded or any(block_groups[i + 1:]):
                    xs = [run_blocks(dec, x, i, i + 1) for x in xs]
                advance()
                continue
            stats = _InputStats()
            _record_block(dec, ops, i, block, [f"{prefix}.{k}" for k in BLOCK_LINEARS], xs, stats)
            before = {n: (getattr(block, n.split(".")[-1]).weight.to(torch.float32), stats.h[n].to(torch.float32))
                      for n in groups}  # what round-to-nearest would have rounded, and its inputs' H
            if opts.method in ("awq", "awq_gptq"):
                scales = _awq_block_scales(block, config, stats, prefix, groups, opts)
                block = fold_scales(block, config, scales)
                work.blocks[i] = block
                for k, s in scales.items():
                    cols = s[wo_expand(config)] if k == "wo" else s
                    stats.h[f"{prefix}.{k}"] = scaled_hessian(stats.h[f"{prefix}.{k}"], cols)
            rounded = {}
            for name, g in groups.items():
                if opts.true_sequential and rounded:  # this layer's inputs through the rounded earlier ones
                    _record_block(dec, ops, i, replace(block, **{n.split(".")[-1]: r for n, r in rounded.items()}),
                                  [name], xs, stats)
                rounded[name] = _round_layer(getattr(block, name.split(".")[-1]), stats.h[name], g, opts, name)
                w, h = getattr(block, name.split(".")[-1]).weight.to(torch.float32), stats.h[name].to(torch.float32)
                w0, h0 = before[name]
                rtn = rtn_record(w0, None, g, opts.symmetric, opts.scale_dtype).dequantized()
                cal.errors[name] = {"error": output_error(w - rounded[name].dequantized(), h),
                                    "rtn_error": output_error(w0 - rtn, h0)}
            cal.layers.update(rounded)
            cal.groups.update(groups)
            # the next block's inputs: this block with its rounded projections
            qblock = replace(block, **{n.split(".")[-1]: r for n, r in rounded.items()})
            work.blocks[i] = qblock
            xs = [run_blocks(dec, x, i, i + 1) for x in xs]
            work.blocks[i] = block
            advance()
        if include_head:
            lw = work.lm_head
            g = plan(HEAD, lw)
            if g is not None:
                stats = _InputStats()
                rec = dec.with_ops(RecordingOps(ops, {id(lw): HEAD}, stats.record))
                for x in xs:
                    logits(rec, x)
                cal.layers[HEAD] = _round_layer(lw, stats.h[HEAD], g, opts, HEAD)
                cal.groups[HEAD] = g
            advance()
    if opts.tuning_steps and cal.layers:
        rounded = (cal.weights, cal.layers)
        cal.weights, cal.layers, cal.tuning = tune_floats(config, fp_weights, work, cal.layers,
                                                          tuning_windows or token_windows,
                                                          Tuning(steps=opts.tuning_steps, rows=opts.tuning_rows),
                                                          validation_windows)
        cal.untuned = rounded if cal.tuning["kept"] else None
    return cal
