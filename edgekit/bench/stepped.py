"""Measuring one stepped engine: its prompt, the reference path's tokens, the timed prefill and decode loop, the token
check and the roofline. Shared by the whole-GPU rows (runner) and the confined ones (partition_run)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from edgekit.bench.document import Roofline, Row
from edgekit.bench.engines import RuntimeEngine
from edgekit.bench.measure import ENERGY_MIN_WINDOW_S, EnergyMeter, median, sync, timed
from edgekit.bench.roofline import decode_bytes, mean_attended_len, roofline_tokens_per_s
from edgekit.kernels.dispatch import DispatchTable
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import Decoder, ModelWeights

KV_BYTES_PER_ELEMENT = 2.0  # the KV cache is FP16 in every engine here


def _prompt(cfg: ModelConfig, T: int, seed: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 100_003 + T)
    return torch.randint(0, cfg.vocab_size, (1, T), generator=g).to(device)  # (1, T)


@dataclass(frozen=True)
class ReferenceRun:
    """The reference path's greedy tokens, and at each step how far its best logit stood above the next one."""

    tokens: list[int]
    margins: list[float]  # top-1 minus top-2 logit, FP32
    scales: list[float]  # the largest |logit| of the step (a margin's yardstick)


@torch.no_grad()
def reference_run(cfg: ModelConfig, weights: ModelWeights, prompt: torch.Tensor, k: int) -> ReferenceRun:
    """The first k greedy tokens of the eager torch reference path (prefill, then k - 1 decode steps)."""
    dec = Decoder(cfg, weights, DispatchTable())
    T = prompt.shape[1]
    cache = dec.new_cache(1, T + k)
    tokens, margins, scales = [], [], []

    def pick(logits: torch.Tensor) -> torch.Tensor:  # (1, V)
        top = logits[0].float().topk(2).values
        tokens.append(int(logits[0].argmax()))
        margins.append(float(top[0] - top[1]))
        scales.append(float(logits[0].float().abs().max()))
        return logits.argmax(-1)

    tok = pick(dec.prefill(prompt, torch.tensor([T], device=prompt.device), cache))  # (1,)
    for i in range(k - 1):
        tok = pick(dec.decode(tok, torch.tensor([T + i], device=prompt.device), cache))
    return ReferenceRun(tokens, margins, scales)


def reference_tokens(cfg: ModelConfig, weights: ModelWeights, prompt: torch.Tensor, k: int) -> list[int]:
    return reference_run(cfg, weights, prompt, k).tokens


def _check_tokens(row: Row, got: list[int], ref: ReferenceRun) -> None:
    """Tokens against the reference path's; at the first difference, the reference's own margin there (a near-tie
    of two logits, which rounding order alone can flip, reads very differently from a wide margin)."""
    k = min(len(got), len(ref.tokens))
    row.tokens, row.reference_tokens, row.tokens_checked = got[:k], ref.tokens[:k], k
    diff = [i for i in range(k) if got[i] != ref.tokens[i]]
    row.tokens_match = not diff
    row.first_mismatch = diff[0] if diff else None
    row.reference_margins = [round(m, 6) for m in ref.margins[:k]]
    if diff:
        row.margin_at_mismatch = ref.margins[diff[0]]
        row.logit_scale_at_mismatch = ref.scales[diff[0]]


def _energy(row: Row, window, tokens: int, note: str) -> None:
    if window is None:
        return
    row.energy_mj_per_token = window.energy_mj / tokens
    row.power_w = window.power_w
    row.energy_window_s = window.seconds
    row.energy_note = note


@torch.no_grad()
def measure_stepped(engine, prompt: torch.Tensor, s, meter: Optional[EnergyMeter], row: Row) -> list[int]:
    """Prefill and decode of a stepped engine, timed into ``row`` (``s``: the run's BenchSettings); its greedy tokens."""
    dev, T, n = engine.device, prompt.shape[1], s.new_tokens
    first = engine.prefill(prompt)  # warm-up: JIT compiles, lazy loads, compile + CUDA-graph recording
    engine.decode(first, T, n)
    engine.decode(first, T, n)
    sync(dev)
    pre = [timed(lambda: engine.prefill(prompt), dev) for _ in range(s.repeats)]
    first = pre[-1][0]
    row.prefill_s_repeats = [t for _, t in pre]
    dec = [timed(lambda: engine.decode(first, T, n), dev) for _ in range(s.repeats)]
    row.decode_s_repeats = [t for _, t in dec]
    tokens = [int(first[0])] + dec[-1][0].tolist()
    t_dec, t_pre = median(row.decode_s_repeats), median(row.prefill_s_repeats)
    row.new_tokens = n
    row.decode_tokens_per_s, row.decode_ms_per_token = n / t_dec, 1000 * t_dec / n
    row.ttft_ms, row.prefill_tokens_per_s = 1000 * t_pre, T / t_pre
    row.prefill_note = engine.prefill_note
    if s.prefill_graph and hasattr(engine, "prefill_graphed"):
        try:
            engine.prefill_graphed(prompt)
            g = [timed(lambda: engine.prefill_graphed(prompt), dev)[1] for _ in range(s.repeats)]
            row.prefill_graphed_ttft_ms, row.prefill_graphed_tokens_per_s = 1000 * median(g), T / median(g)
        except Exception as e:  # noqa: BLE001 - an extra figure; its failure is data, not a crash
            row.prefill_graphed_error = f"{type(e).__name__}: {e}"
    if s.profile and isinstance(engine, RuntimeEngine):
        try:
            from edgekit.bench.profile import profile_decode

            row.profile = profile_decode(engine, first, T, n)
        except Exception as e:  # noqa: BLE001 - an explanation, not a figure the run depends on
            row.profile = {"error": f"{type(e).__name__}: {e}"}
    if meter is not None:
        loops = max(1, math.ceil(ENERGY_MIN_WINDOW_S / t_dec))
        _, window, _ = meter.measure(lambda: [engine.decode(first, T, n) for _ in range(loops)], dev)
        _energy(row, window, loops * n, f"decode loop only, {loops} x {n} tokens back to back")
    return tokens


def _roofline(cfg: ModelConfig, weights: ModelWeights, row: Row, T: int, bw: Optional[float]) -> None:
    if bw is None or row.new_tokens is None:
        return
    b = decode_bytes(cfg, weights, mean_attended_len(T, row.new_tokens), KV_BYTES_PER_ELEMENT)
    ceiling = roofline_tokens_per_s(b.total, bw)
    row.roofline = Roofline(bytes_per_token=b.total, weight_bytes=b.weights, kv_bytes=b.kv_cache,
                            attended_len=b.attended_len, tokens_per_s=ceiling,
                            fraction=row.decode_tokens_per_s / ceiling if row.decode_tokens_per_s else None)


def _short(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {e}".strip()
    return msg if len(msg) <= 600 else msg[:600] + " ..."
