"""Teacher-forced forward passes that return every position, for calibration and evaluation.

``Decoder.prefill`` returns only the logits of each sequence's last token,
which is what generation needs; perplexity, calibration statistics and the
per-layer sensitivity need the hidden states and logits at every position,
and the sensitivity search wants to restart from the input of block i. This
module runs the decoder's own ``_block`` and ``_logits`` (so the arithmetic
is exactly what ``generate`` runs, through the same dispatch table) on
unpadded windows of real tokens, without touching the decoder.

A ``kv_transform(layer, k, v) -> (k, v)`` hook sees the keys and values each
block attends to. The INT8 KV cache passes its quantize-dequantize round trip
there, so teacher-forced evaluation attends to the same rounded K/V that a
decode step reads back from the cache; calibration passes a recorder.
"""

from __future__ import annotations

from typing import Callable

import torch

from edgekit.model.decoder import BlockWeights, Decoder
from edgekit.model.embedding import lookup

KVTransform = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@torch.no_grad()
def embed(decoder: Decoder, tokens: torch.Tensor) -> torch.Tensor:
    """tokens (B, T) -> hidden states (B, T, C)."""
    return lookup(decoder.weights.tok_embeddings, tokens.to(decoder.device))


@torch.no_grad()
def run_blocks(
    decoder: Decoder,
    x: torch.Tensor,
    start: int = 0,
    stop: int | None = None,
    kv_transform: KVTransform | None = None,
) -> torch.Tensor:
    """Run blocks [start, stop) on hidden states x (B, T, C) of full, unpadded sequences; returns (B, T, C)."""
    blocks = decoder.weights.blocks
    stop = len(blocks) if stop is None else stop
    for i in range(start, stop):
        x = block_output(decoder, blocks[i], x, i, kv_transform)
    return x


def block_output(decoder: Decoder, b: BlockWeights, x: torch.Tensor, i: int = 0,
                 kv_transform: KVTransform | None = None) -> torch.Tensor:
    """One block ``b`` (as block i) on hidden states x (B, T, C) of full sequences; differentiable where the caller
    enables gradients (edgekit.quant.int4_tuning tunes the float parameters through it; run_blocks does not)."""
    cfg, ops = decoder.config, decoder.ops
    B, T, _ = x.shape
    cos = decoder._cos[:T][None].expand(B, T, -1)  # (B, T, D/2)
    sin = decoder._sin[:T][None].expand(B, T, -1)
    seq_lens = torch.full((B,), T, dtype=torch.long, device=x.device)  # (B,) every position is real

    def attend(h):
        q, k, v = ops.qkv_rope(h, b.wqkv, cos, sin, cfg.n_heads, cfg.n_kv_heads)  # (B, H, T, D)
        if kv_transform is not None:
            k, v = kv_transform(i, k, v)
        o = ops.attention_prefill(q, k, v, seq_lens)  # (B, Hq, T, D)
        return o.transpose(1, 2).reshape(B, T, cfg.q_size)

    return decoder._block(b, x, attend)


@torch.no_grad()
def logits(decoder: Decoder, x: torch.Tensor) -> torch.Tensor:
    """Final norm + LM head at every position: (B, T, C) -> (B, T, V)."""
    return decoder._logits(x)


@torch.no_grad()
def all_logits(decoder: Decoder, tokens: torch.Tensor, kv_transform: KVTransform | None = None) -> torch.Tensor:
    """tokens (B, T) -> logits (B, T, V) at every position."""
    return logits(decoder, run_blocks(decoder, embed(decoder, tokens), kv_transform=kv_transform))
