"""Norm tweaking after INT4 rounding: the RMSNorm weights tuned end to end while the INT4 records stay as rounded.

Once every projection's INT4 codes, scales and offsets are fixed, the model
still has floating-point parameters that can make up for part of the rounding
error: every RMSNorm weight (norm tweaking, Li et al., 2023). A block norm
scales the input channels of the projection it feeds, so tuning it is a
per-input-channel correction of that projection that costs nothing at run
time. They are tuned with Adam so that the quantized model's next-token
distributions follow the FP model's on the calibration windows:

    min  mean over positions of KL( p_fp || p_int4 )

The parameters are relative, so one learning rate fits them all: a norm weight
becomes n (1 + c), c starting at 0 (the model as rounded). Adam visits the
windows in order (no random numbers: deterministic). The tuned model is kept
only if its mean KL over all calibration windows is below the rounded
model's.

``rows`` also tunes a factor per output row of every INT4 block projection,
folded into that row's FP16 group scales and offsets (and its bias). Measured
on the default model it overfits the calibration text (the table below).

A block's norm is tuned only when every projection it feeds is floating point
in ``fp_weights`` (not an INT4 record taken in as it came); its change is
folded into those projections' floating-point weights (W n / n'), so the FP
model keeps its function there (the INT8 fallback records come from it). The
final norm feeds the LM head, which is usually tied to the embedding: it is
tuned and not folded, so the FP model carries the tuned final norm. The
tuning compensates the errors of every INT4 layer, so a mixed-precision
fallback (--allow-mixed) starts from the model as rounded instead
(``Int4Calibration.untuned``, edgekit.quant.quantize).

Measured on SmolLM2-135M-Instruct (CPU, FP32 activations, shipped held-out text, g128 = g64 at K = 576; on top of
GPTQ onto searched groups, damp 0.5; scripts/eval_int4_calibration.py):

    recipe                     ppl +%   greedy   SNR dB   held-out KL   calibration KL
    gptq+search (no tuning)     8.01    0.936    15.61      0.0860         0.0687
    + tune=48 (norms)           5.73    0.939    15.73      0.0842         0.0265
    + tune=48+rows              3.34    0.936    13.06      0.1064         0.0288

The calibration KL falls by 60% while the held-out KL barely moves: most of
what the tuning fits is specific to the 2048 calibration tokens. With the norms
alone every held-out figure still improves (the default); the row factors buy
perplexity at the price of a worse held-out KL and SNR (and +6.5% with 4096
calibration tokens), so they stay opt-in.

Two opt-in levers against that overfitting (QuantizeOptions.int4_tuning_generated, int4_tuning_validation_tokens):
more tuning data sampled from the FP model itself (edgekit.quant.self_generated), and early stopping on
calibration text the tuning does not visit (``validation``). Neither moves the held-out KL either (same recipe;
scripts/eval_int4_calibration.py variant gptq+search+tune=48+gen=32+val=1024, and exploratory runs of the same
functions): with 32 self-generated sequences of 256 tokens and early stopping the validation KL is lowest after 8
steps (0.0802 -> 0.0787) and the held-out figures are +6.65% perplexity, 93.9% greedy, 15.83 dB, held-out KL
0.0850 (543 s of calibration, sampling 77 s of it); GPTQ's H gathered on those sequences as well (no tuning) gives +9.2%, 16.26 dB, held-out KL 0.0870; with ``rows``
on the same data the validation KL never falls below the rounded model's at any check, so early stopping drops
the tuning (the result is the rounded model: +8.01%). The
held-out KL of this rounding stays at 0.084-0.087 whatever the floats are tuned on: the perplexity gains of the
tuning are not a closer match to the FP model.

Tried and dropped on the same model: each block's norms and group scales tuned
by Adam towards the FP model's block outputs (64 steps a block: +7.1% for 3.5
extra CPU-minutes), and a least-squares refit of the group scales (and norms)
towards the FP block outputs (+8.9% / +9.8%): the block-output error is
dominated by the few residual channels and tokens with very large
activations, which the next RMSNorm divides away; the KL of the logits weighs
every error by what it does to the prediction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from edgekit.kernels.linear import LinearWeights
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import Decoder, ModelWeights
from edgekit.kernels.dispatch import DispatchTable
from edgekit.quant.forward import block_output, embed, head_logits
from edgekit.model.layers import HEAD, with_layers

NORM_CONSUMERS = {"attn_norm": ("wqkv",), "ffn_norm": ("w_gate_up",)}  # the projections each block norm feeds


@dataclass
class Tuning:
    steps: int = 48  # Adam steps, one calibration window each
    lr: float = 3e-3  # on the relative parameters
    rows: bool = False  # tune the INT4 projections' row factors too (see the module doc for what they did)
    check_every: int = 8  # steps between two measurements of the validation KL (early stopping), when there is one


class _ScaledOps:
    """The reference dispatch table with each named projection's output multiplied by its factor (1 + c).

    The factors belong to INT4 records, whose QKV projection the graph runs as ``linear`` then ``rope`` (only a
    float QKV fuses into ``qkv_rope``): a row factor acts before RoPE, as it must."""

    def __init__(self, inner: DispatchTable, factors: dict[int, torch.Tensor]):
        self._inner, self._factors = inner, factors

    def __getattr__(self, name):  # get, sources: the inner table's
        return getattr(self._inner, name)

    def on_linear_output(self, node, record: LinearWeights, y: torch.Tensor) -> torch.Tensor:
        c = self._factors.get(id(record))
        return y if c is None else y * (1 + c)


def _log_probs(decoder: Decoder, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token log-probabilities (B, T, V) in FP32; differentiable where the caller enables gradients."""
    x = embed(decoder, tokens)
    for i, b in enumerate(decoder.weights.blocks):
        x = block_output(decoder, b, x, i)
    return torch.log_softmax(head_logits(decoder, x).to(torch.float32), dim=-1)


def mean_kl(target: list[torch.Tensor], decoder: Decoder, windows: list[torch.Tensor]) -> float:
    """Mean KL(p_fp || p) per position over the windows, with ``target`` the FP log-probabilities (FP16 kept)."""
    with torch.no_grad():
        kls = [_kl(t, _log_probs(decoder, w)) for t, w in zip(target, windows)]
    return float(sum(k * w.numel() for k, w in zip(kls, windows)) / sum(w.numel() for w in windows))


def _kl(target: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    t = target.to(torch.float32)
    return (t.exp() * (t - log_p)).sum(-1).mean()


def tune_floats(config: ModelConfig, fp_model: ModelWeights, fp_weights: ModelWeights, layers: dict[str, LinearWeights],
                windows: list[torch.Tensor], opts: Tuning, validation: list[torch.Tensor] | None = None,
                ) -> tuple[ModelWeights, dict[str, LinearWeights], dict]:
    """Tune the norms (and with ``opts.rows`` the INT4 records' row factors; see the module doc).

    ``fp_model``: the model as loaded (the targets); ``fp_weights``: its working copy (AWQ folds) that ``layers``
    (name -> INT4 record) replace; ``windows``: what Adam visits, in order. With ``validation`` (token windows the
    tuning never sees), the parameters kept are those of the check (every ``opts.check_every`` steps) with the lowest
    validation KL, and the tuning is kept only if that KL is below the rounded model's (early stopping); without it,
    the last step's, kept if the KL on ``windows`` fell. Returns the FP weights with the tuned norms (block norms
    folded), the records with their row factors folded in, and {"kl_before", "kl_after", "kept"} (nats per position,
    on ``windows``; "validation_kl_before", "validation_kl_after", "best_step" with ``validation``) with the number of
    windows and validation windows.
    """
    ops = DispatchTable()
    fp_dec = Decoder(config, fp_model, ops)
    with torch.no_grad():
        target = [_log_probs(fp_dec, w).to(torch.float16) for w in windows]  # FP16: half the memory of (T, V) FP32
        val_target = [_log_probs(fp_dec, w).to(torch.float16) for w in validation or []]
    q = with_layers(fp_weights, layers)
    before = mean_kl(target, Decoder(config, q, ops), windows)
    # float copies of the INT4 records, dequantized once rather than at every step
    flt = {n: LinearWeights("linear", lw.dequantized(), lw.bias) for n, lw in layers.items() if lw.op == "linear_w4a16"}
    qf = with_layers(q, flt)
    # the block projections' rows (an INT4 head's rows are the tied embedding's too: left as rounded)
    int4 = {n: layers[n] for n in flt if n != HEAD} if opts.rows else {}
    rows = {n: torch.zeros(flt[n].out_features, requires_grad=True) for n in int4}
    norms = {(i, n): torch.zeros_like(getattr(b, n), requires_grad=True) for i, b in enumerate(fp_weights.blocks)
             for n, feeds in NORM_CONSUMERS.items() if all(getattr(b, k).op == "linear" for k in feeds)}
    final = torch.zeros_like(fp_weights.norm, requires_grad=True)
    params = [*rows.values(), *norms.values(), final]
    ids = {id(flt[n]): c for n, c in rows.items()}

    def model() -> Decoder:
        blocks = [replace(b, **{n: getattr(b, n) * (1 + norms[i, n]) for n in NORM_CONSUMERS if (i, n) in norms})
                  for i, b in enumerate(qf.blocks)]
        return Decoder(config, replace(qf, blocks=blocks, norm=qf.norm * (1 + final)), ops).with_ops(_ScaledOps(ops, ids))

    report: dict = {"kl_before": before, "windows": len(windows), "validation_windows": len(validation or [])}
    best = None  # (validation KL, step, parameter values)
    if validation:
        report["validation_kl_before"] = mean_kl(val_target, model(), validation)
        best = (report["validation_kl_before"], 0, [p.detach().clone() for p in params])
    optimizer = torch.optim.Adam(params, lr=opts.lr)
    with torch.enable_grad():
        for step in range(opts.steps):
            j = step % len(windows)
            loss = _kl(target[j], _log_probs(model(), windows[j]))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if validation and ((step + 1) % opts.check_every == 0 or step + 1 == opts.steps):
                kl = mean_kl(val_target, model(), validation)
                if kl < best[0]:
                    best = (kl, step + 1, [p.detach().clone() for p in params])
    if best is not None:
        with torch.no_grad():
            for p, v in zip(params, best[2]):
                p.copy_(v)
        report.update(validation_kl_after=best[0], best_step=best[1])

    with torch.no_grad():
        new_layers = dict(layers)
        for n, lw in int4.items():
            f = 1 + rows[n].detach()
            dt = lw.scale.dtype
            new_layers[n] = replace(lw, scale=(lw.scale.to(torch.float32) * f[:, None]).to(dt),
                                    offset=None if lw.offset is None else (lw.offset.to(torch.float32) * f[:, None]).to(dt),
                                    bias=None if lw.bias is None else lw.bias * f.to(lw.bias.dtype))
        blocks = []
        for i, b in enumerate(fp_weights.blocks):
            change = {}
            for n, feeds in NORM_CONSUMERS.items():
                if (i, n) in norms:
                    r = 1 + norms[i, n].detach()
                    change[n] = getattr(b, n) * r
                    change.update({k: replace(getattr(b, k), weight=getattr(b, k).weight / r[None, :]) for k in feeds})
            blocks.append(replace(b, **change))
        new_fp = replace(fp_weights, blocks=blocks, norm=fp_weights.norm * (1 + final.detach()))
        report["kl_after"] = mean_kl(target, Decoder(config, with_layers(new_fp, new_layers), ops), windows)
    report["kept"] = (best[1] > 0) if best is not None else report["kl_after"] < before
    return (new_fp, new_layers, report) if report["kept"] else (fp_weights, dict(layers), report)
