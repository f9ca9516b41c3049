"""Teacher-forced forward passes that return every position, for calibration and evaluation.

``Decoder.prefill`` returns only the logits of each sequence's last token,
which is what generation needs; perplexity, calibration statistics and the
per-layer sensitivity need the hidden states and logits at every position,
and the sensitivity search wants to restart from the input of block i. These
run the model's own forward graph at the ``sequence`` phase (``edgekit.graph``:
the per-operator path, through the decoder's dispatch table, so the arithmetic
is exactly what ``generate`` runs) on unpadded windows of real tokens.

A ``kv_transform(layer, k, v) -> (k, v)`` hook sees the keys and values each
block attends to. The INT8 KV cache passes its quantize-dequantize round trip
there, so teacher-forced evaluation attends to the same rounded K/V that a
decode step reads back from the cache; calibration passes a recorder.
"""

from __future__ import annotations

from typing import Callable

import torch

from edgekit.graph.executor import block_nodes, head_nodes, run_graph
from edgekit.graph.node import SEQUENCE
from edgekit.model.decoder import BlockWeights, Decoder

KVTransform = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _window(decoder: Decoder, x: torch.Tensor, kv_transform: KVTransform | None, blocks=None):
    B, T = x.shape[:2]
    ctx = decoder.context(SEQUENCE, tokens=torch.empty(B, T, dtype=torch.long, device=x.device),
                          seq_lens=torch.full((B,), T, dtype=torch.long, device=x.device))  # every position is real
    ctx.kv_transform, ctx.blocks = kv_transform, blocks
    return ctx


@torch.no_grad()
def embed(decoder: Decoder, tokens: torch.Tensor) -> torch.Tensor:
    """tokens (B, T) -> hidden states (B, T, C)."""
    g = decoder.graph(SEQUENCE)
    tokens = tokens.to(decoder.device)
    ctx = decoder.context(SEQUENCE, tokens=tokens)
    first = [i for i, n in enumerate(g.nodes) if g.streams[0][0] in n.outputs.values()]
    return run_graph(g, ctx, nodes=first, keep=(g.streams[0][0],))[g.streams[0][0]]


@torch.no_grad()
def run_blocks(
    decoder: Decoder,
    x: torch.Tensor,
    start: int = 0,
    stop: int | None = None,
    kv_transform: KVTransform | None = None,
) -> torch.Tensor:
    """Run blocks [start, stop) on hidden states x (B, T, C) of full, unpadded sequences; returns (B, T, C)."""
    g = decoder.graph(SEQUENCE)
    stop = len(g.streams) if stop is None else stop
    if stop <= start:
        return x
    out = g.streams[stop - 1][1]
    env = run_graph(g, _window(decoder, x, kv_transform), {g.streams[start][0]: x}, block_nodes(g, start, stop),
                    keep=(out,))  # one layer's intermediates alive at a time, not every layer's
    return env[out]


def block_output(decoder: Decoder, b: BlockWeights, x: torch.Tensor, i: int = 0,
                 kv_transform: KVTransform | None = None) -> torch.Tensor:
    """One block ``b`` (as block i) on hidden states x (B, T, C) of full sequences; differentiable where the caller
    enables gradients (edgekit.quant.int4_tuning tunes the float parameters through it; run_blocks does not)."""
    g = decoder.graph(SEQUENCE, blocks={i: b})
    env = run_graph(g, _window(decoder, x, kv_transform, {i: b}), {g.streams[i][0]: x}, block_nodes(g, i, i + 1),
                    keep=(g.streams[i][1],))
    return env[g.streams[i][1]]


@torch.no_grad()
def logits(decoder: Decoder, x: torch.Tensor) -> torch.Tensor:
    """Final norm + LM head at every position: (B, T, C) -> (B, T, V)."""
    return head_logits(decoder, x)


def head_logits(decoder: Decoder, x: torch.Tensor) -> torch.Tensor:
    """``logits``, differentiable where the caller enables gradients (int4_tuning)."""
    g = decoder.graph(SEQUENCE)
    env = run_graph(g, _window(decoder, x, None), {g.streams[-1][1]: x}, head_nodes(g), keep=(g.outputs["logits"],))
    return env[g.outputs["logits"]]


@torch.no_grad()
def all_logits(decoder: Decoder, tokens: torch.Tensor, kv_transform: KVTransform | None = None) -> torch.Tensor:
    """tokens (B, T) -> logits (B, T, V) at every position."""
    return logits(decoder, run_blocks(decoder, embed(decoder, tokens), kv_transform=kv_transform))
