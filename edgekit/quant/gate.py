"""The accuracy gate: does the quantized model still behave like the floating-point one on held-out text?

Three measurements, all against the unquantized model on the same tokens:

- perplexity: exp(mean next-token negative log-likelihood) over the text cut
  into non-overlapping windows of ``window_len`` tokens (each window scored on
  its own, so it counts window_len - 1 predictions); the gate bounds the
  relative increase, quant / fp - 1.
- greedy agreement over ``new_tokens`` tokens, teacher-forced: the FP model
  generates ``new_tokens`` tokens greedily from each prompt (prefill + decode
  steps as ``edgekit generate`` runs them, no stop token); then the quantized
  model reads prompt + that FP continuation in one pass, and the agreement is
  the fraction of the ``new_tokens`` positions where its argmax is the token
  the FP model generated there. Teacher forcing keeps one early disagreement
  from being counted again at every later position; the first disagreement of
  each prompt is reported too.
  Where the FP model scores the text worse than a uniform guess over its
  vocabulary (random preset weights), the text cannot judge it: the bound then
  holds exp(mean KL(fp || quant)) - 1, the increase on text the FP model would
  write itself (``judged_increase``, ``judged_by``).
- logits SNR over every scored position of the perplexity windows:
  10 log10(sum fp^2 / sum (fp - quant)^2), in dB.

The FP side is computed once (``Reference``) and kept as final hidden states,
so re-evaluating candidates (mixed precision) only re-runs the quantized model;
edgekit.quant.reference_cache keeps it on disk by content, so `build`,
`quantize` and `eval` on the same model and text compute it once.

Windows (and teacher-forced sequences) of equal length run through the blocks as
one batch: on a CPU a forward pass over B windows reads every weight once, about
twice as fast as B separate passes, with identical results (rows never interact).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from edgekit.errors import QuantizationError
from edgekit.model.decoder import Decoder
from edgekit.quant.forward import KVTransform, embed, logits, run_blocks
from edgekit.quant.judged_by import JUDGED_BY_KL, JUDGED_BY_TEXT
from edgekit.quant.progress import SILENT, Steps


SNR_W4A16_DB = 12.0
_LOG_FLOAT_MAX = math.log(1.7976931348623157e308)


def exp_or_inf(x: float) -> float:
    """exp(x), or inf where a double cannot hold it: a random-weight model's mean NLL passes 709 nats a token
    (gemma-3-1b's preset, 262k-token head), and its perplexity is infinite, not a crash."""
    return math.exp(x) if x <= _LOG_FLOAT_MAX else math.inf


@dataclass
class GateConfig:
    """Thresholds (the pass/fail rule) and the evaluation budget (how much text is read)."""

    max_ppl_increase: float = 0.01  # relative: 0.01 = perplexity at most 1% above FP
    min_greedy_agreement: float = 0.95  # fraction of teacher-forced greedy positions that agree
    min_logits_snr_db: float = 20.0  # 20 dB: error energy at most 1% of the logits' energy
    ppl_tokens: int = 2048  # held-out tokens scored for perplexity and SNR (at most)
    window_len: int = 256
    n_prompts: int = 4
    prompt_len: int = 32
    new_tokens: int = 128

    @classmethod
    def for_mode(cls, mode: str, **overrides) -> "GateConfig":
        """Defaults per mode; ``None`` overrides are ignored so CLI options can pass through."""
        # W4A16 gets the W8A8 bounds on perplexity and agreement (issue #14: +3%, 90%); its logits SNR bound is
        # lower because 4-bit weights perturb every logit a little even where the argmax and the likelihood hold.
        base = {"w8a16": {}, "w8a8": {"max_ppl_increase": 0.03, "min_greedy_agreement": 0.90, "min_logits_snr_db": 15.0},
                "w4a16": {"max_ppl_increase": 0.03, "min_greedy_agreement": 0.90, "min_logits_snr_db": SNR_W4A16_DB}}
        if mode not in base:
            raise QuantizationError(f"unknown quantization mode {mode!r}; expected one of {', '.join(base)}")
        cfg = cls(**{**base[mode], **{k: v for k, v in overrides.items() if v is not None}})
        cfg.validate()
        return cfg

    def validate(self) -> None:
        # click takes "nan" and "inf" as floats: a NaN SNR bound passed every model (x < nan is false), a NaN
        # perplexity bound failed every one, and report.json's "nan" / "inf" then crashed `eval --quantized`
        for flag, k in (("--max-ppl-increase", "max_ppl_increase"), ("--min-snr-db", "min_logits_snr_db")):
            if not math.isfinite(getattr(self, k)):
                raise QuantizationError(f"{flag} ({k}) must be a finite number, got {getattr(self, k)}",
                                        hint="pass a number, e.g. 1.0 for +100% or 0 dB for a loose bound")
        if self.max_ppl_increase < 0:
            raise QuantizationError(f"--max-ppl-increase (max_ppl_increase) must be >= 0, got {self.max_ppl_increase}",
                                    hint="a fraction of the FP16 perplexity: 0.01 allows +1%")
        if not 0 <= self.min_greedy_agreement <= 1:
            raise QuantizationError(f"--min-agreement (min_greedy_agreement) must be in [0, 1], got "
                                    f"{self.min_greedy_agreement}", hint="a fraction of greedy tokens: 0.95 = 95%")
        for k in ("ppl_tokens", "window_len", "new_tokens", "prompt_len"):
            if getattr(self, k) < 2:
                raise QuantizationError(f"{k} must be >= 2, got {getattr(self, k)}")
        if self.n_prompts < 0:
            raise QuantizationError(f"n_prompts must be >= 0, got {self.n_prompts}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class EvalText:
    """Token ids to evaluate on: perplexity windows (1, T) and greedy prompts."""

    windows: list[torch.Tensor]
    prompts: list[list[int]] = field(default_factory=list)


@dataclass
class Reference:
    """The floating-point side, computed once."""

    decoder: Decoder
    windows: list[torch.Tensor]  # (1, T) token ids
    hidden: list[torch.Tensor]  # (1, T, C) FP final hidden states (before the final norm)
    sequences: list[torch.Tensor]  # (1, P + N) prompt + FP greedy continuation
    prompt_lens: list[int]

    @property
    def n_scored(self) -> int:
        return sum(w.shape[1] - 1 for w in self.windows)


@torch.no_grad()
def greedy_batch(decoder: Decoder, prompts: list[list[int]], new_tokens: int, steps: Steps = SILENT) -> list[list[int]]:
    """Greedy continuations of ``new_tokens`` tokens (no stop tokens) for all prompts at once.

    The same prefill + decode steps as ``edgekit generate``, with the prompts as
    one padded batch: a decode step reads every weight once for all of them, so
    four prompts cost about what one does on a memory-bound CPU.
    """
    B, P = len(prompts), max(len(p) for p in prompts)
    dev = decoder.device
    tokens = torch.zeros((B, P), dtype=torch.long, device=dev)  # (B, P) right-padded
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    seq_lens = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=dev)  # (B,)
    cache = decoder.new_cache(B, P + new_tokens)
    out = torch.empty((B, new_tokens), dtype=torch.long, device=dev)
    with steps.task("FP greedy generation", new_tokens) as advance:
        nxt = decoder.prefill(tokens, seq_lens, cache).argmax(-1)  # (B,)
        out[:, 0] = nxt
        advance()
        pos = seq_lens.clone()  # (B,) position of the token being fed
        for t in range(1, new_tokens):
            nxt = decoder.decode(nxt, pos, cache).argmax(-1)
            out[:, t] = nxt
            pos = pos + 1
            advance()
    return out.tolist()


MAX_BATCH_ROWS = 8  # windows per batched pass: (8, 256) activations and attention scores stay far below 100 MB


@torch.no_grad()
def batched_hidden(decoder: Decoder, seqs: list[torch.Tensor], kv_transform: KVTransform | None = None,
                   advance=lambda: None) -> list[torch.Tensor]:
    """Final hidden states (1, T, C) of each (1, T) token sequence, equal lengths run as one batch."""
    out: list[torch.Tensor | None] = [None] * len(seqs)
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(seqs):
        by_len.setdefault(s.shape[1], []).append(i)
    for idx in by_len.values():
        for k in range(0, len(idx), MAX_BATCH_ROWS):
            chunk = idx[k : k + MAX_BATCH_ROWS]
            h = run_blocks(decoder, embed(decoder, torch.cat([seqs[i] for i in chunk])), kv_transform=kv_transform)  # (B, T, C)
            for row, i in enumerate(chunk):
                out[i] = h[row : row + 1]
                advance()
    return out  # type: ignore[return-value]


@torch.no_grad()
def build_reference(fp_decoder: Decoder, text: EvalText, new_tokens: int, steps: Steps = SILENT) -> Reference:
    sequences, prompt_lens = [], []
    if text.prompts:
        for p, cont in zip(text.prompts, greedy_batch(fp_decoder, text.prompts, new_tokens, steps)):
            sequences.append(torch.tensor([p + cont], dtype=torch.long))  # (1, P + N)
            prompt_lens.append(len(p))
    with steps.task("FP reference pass", len(text.windows)) as advance:
        hidden = batched_hidden(fp_decoder, text.windows, advance=advance)
    return Reference(fp_decoder, text.windows, hidden, sequences, prompt_lens)


def _log_probs(lg: torch.Tensor) -> torch.Tensor:
    """Next-token log-probabilities at the scored positions 0..T-2 of logits (T, V)."""
    return torch.log_softmax(lg[:-1].to(torch.float32), dim=-1)  # (T-1, V)


def _nll_sum(logp: torch.Tensor, tokens: torch.Tensor) -> float:
    """Sum of the NLL of tokens 1..T-1 under log-probabilities (T-1, V)."""
    return float(-logp.gather(1, tokens[1:, None]).to(torch.float64).sum())


@torch.no_grad()
def evaluate(
    quant_decoder: Decoder,
    ref: Reference,
    kv_transform: KVTransform | None = None,
    steps: Steps = SILENT,
    label: str = "evaluating",
    text_name: str = JUDGED_BY_TEXT,
) -> dict:
    """Measure the quantized model against the reference. Returns the metrics as a plain dict.

    ``text_name`` is what the reference's text is (``scored_text``, and ``judged_by`` when the text judges): edgekit's
    held-out text by default, a user's file as ``judged_by.text_file(path)`` names it."""
    nll_fp = nll_q = kl = 0.0
    sig = err = 0.0
    with steps.task(label, len(ref.windows) + len(ref.sequences)) as advance:
        quant_hidden = batched_hidden(quant_decoder, ref.windows, kv_transform)
        for w, h, hq in zip(ref.windows, ref.hidden, quant_hidden):
            lf = logits(ref.decoder, h)[0]  # (T, V)
            lq = logits(quant_decoder, hq)[0]
            tok = w[0].to(lf.device)
            lpf, lpq = _log_probs(lf), _log_probs(lq)  # (T-1, V)
            nll_fp += _nll_sum(lpf, tok)
            nll_q += _nll_sum(lpq, tok)
            kl += float(torch.sum(lpf.exp() * (lpf - lpq), dtype=torch.float64))
            d = lf[:-1].float() - lq[:-1].float()  # (T-1, V) scored positions only
            sig += float(torch.sum(lf[:-1].float().pow(2), dtype=torch.float64))
            err += float(torch.sum(d.pow(2), dtype=torch.float64))
            advance()
        agree = total = 0
        first_div = []
        for s, p, hq in zip(ref.sequences, ref.prompt_lens, batched_hidden(quant_decoder, ref.sequences, kv_transform)):
            lq = logits(quant_decoder, hq)[0]
            # Positions P-1 .. P+N-2 predict the N generated tokens.
            same = lq[p - 1 : -1].argmax(-1) == s[0, p:].to(lq.device)  # (N,)
            agree += int(same.sum())
            total += same.numel()
            miss = (~same).nonzero()
            first_div.append(int(miss[0]) if miss.numel() else None)
            advance()
    n = ref.n_scored
    vocab = ref.decoder.config.vocab_size
    increase = exp_or_inf((nll_q - nll_fp) / n) - 1.0  # quant / fp - 1, finite where both overflow
    fp_perplexity = exp_or_inf(nll_fp / n)
    fits = fp_perplexity <= vocab
    return {
        "fp_perplexity": fp_perplexity,
        "quant_perplexity": exp_or_inf(nll_q / n),
        "perplexity_increase": increase,
        # What the perplexity bound is held to: the increase on the text, unless the FP model scores the text worse
        # than a uniform guess over its vocabulary (random preset weights: ~3.8e184 at qwen3-1.7b), where the text
        # says nothing of it; then the increase on text the FP model would write itself, exp(mean KL(fp || quant))
        # - 1 (the expected NLL increase per token when the tokens come from the FP model's own distribution).
        "vocab_size": vocab,
        "judged_increase": increase if fits else exp_or_inf(kl / n) - 1.0,  # a NaN KL is inf: it fails
        "judged_by": text_name if fits else JUDGED_BY_KL,
        "scored_text": text_name,
        "greedy_agreement": agree / total if total else None,
        "greedy_positions": total,
        "first_disagreement": first_div,
        "logits_snr_db": 10.0 * math.log10(sig / err) if err > 0 else math.inf,
        "mean_kl_nats": kl / n,  # KL(fp || quant) per scored token: reported, not gated
        "tokens_scored": n,
    }


def check(metrics: dict, cfg: GateConfig) -> list[str]:
    """The reasons the gate fails (empty list: it passes)."""
    fails = []
    by_kl = metrics.get("judged_by") == JUDGED_BY_KL
    scored = metrics.get("scored_text", JUDGED_BY_TEXT)  # reports written before it: the held-out text
    increase = metrics.get("judged_increase", metrics["perplexity_increase"])  # reports written before it: the text's
    if not increase <= cfg.max_ppl_increase:  # NaN fails
        if by_kl:
            fails.append(
                f"perplexity on the FP model's own predictions {100 * increase:+.2f}% (exp of the mean KL "
                f"{metrics['mean_kl_nats']:.4f} nats a token; allowed +{100 * cfg.max_ppl_increase:.2f}%): the FP "
                f"model scores the {scored} at perplexity {metrics['fp_perplexity']:.3g}, worse than a uniform "
                f"guess over its {metrics['vocab_size']} tokens, so the text cannot judge it")
        else:
            fails.append(
                f"perplexity {metrics['quant_perplexity']:.3f} is {100 * increase:+.2f}% vs FP "
                f"{metrics['fp_perplexity']:.3f} (allowed +{100 * cfg.max_ppl_increase:.2f}%)"
            )
    ga = metrics["greedy_agreement"]
    if ga is not None and ga < cfg.min_greedy_agreement:
        fails.append(f"greedy agreement {100 * ga:.1f}% < {100 * cfg.min_greedy_agreement:.1f}%")
    if metrics["logits_snr_db"] < cfg.min_logits_snr_db:
        fails.append(f"logits SNR {metrics['logits_snr_db']:.1f} dB < {cfg.min_logits_snr_db:.1f} dB")
    return fails


class GateFailedError(QuantizationError):
    """The quantized model failed the accuracy gate; ``report`` says by how much and which layers hurt most."""

    def __init__(self, message: str, report: dict, *, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.report = report


@torch.no_grad()
def perplexity(decoder: Decoder, windows: list[torch.Tensor], kv_transform: KVTransform | None = None,
               steps: Steps = SILENT) -> dict:
    """Perplexity of one model over token windows (1, T), each scored on its own."""
    nll = 0.0
    n = 0
    with steps.task("perplexity", len(windows)) as advance:
        for w, h in zip(windows, batched_hidden(decoder, windows, kv_transform)):
            lg = logits(decoder, h)[0]  # (T, V)
            nll += _nll_sum(_log_probs(lg), w[0].to(lg.device))
            n += w.shape[1] - 1
            advance()
    return {"perplexity": exp_or_inf(nll / n), "tokens_scored": n}
