"""The decode roofline: the bytes one token must read, over the copy bandwidth measured in the same run.

A batch-1 decode step is a chain of matrix-vector products: every weight is
read once per token and the attention reads the K and V of every earlier
position. No kernel can run the step faster than those bytes take to stream
at the device's copy bandwidth, so ``bandwidth / bytes`` is the ceiling in
tokens per second and a measured rate divided by it is the fraction reached.

Counted per token (read once each): every block's linear weights at their
stored precision (INT8 values + FP32 scales + biases), the two norms of each
block, the final norm, the LM head (the whole matrix; for a tied model it is
the embedding table), one embedding row, and the KV cache up to the position
being decoded (plus the one K/V row it writes). Activations are a few KB and
left out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from edgekit.model.config import ModelConfig
from edgekit.model.decoder import ModelWeights
from edgekit.model.embedding import QuantizedEmbedding


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


@dataclass(frozen=True)
class DecodeBytes:
    weights: int  # bytes of weights read per token
    kv_cache: int  # bytes of K/V read (and the one row written) per token
    attended_len: float  # the mean number of positions attended over the decode loop

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache

    def to_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def weight_bytes_per_token(weights: ModelWeights) -> int:
    """Weight bytes one decode step reads: every block, the final norm, the LM head and one embedding row."""
    n = 0
    for b in weights.blocks:
        n += sum(lw.nbytes() for lw in b.linears().values())
        n += sum(_nbytes(t) for t in b.norms().values())
    n += _nbytes(weights.norm) + weights.lm_head.nbytes()
    emb = weights.tok_embeddings
    # the looked-up row (of a tied quantized head: its codes and scales)
    n += emb.row_nbytes() if isinstance(emb, QuantizedEmbedding) else emb.shape[1] * emb.element_size()
    return n


def kv_bytes_per_token(cfg: ModelConfig, attended_len: float, kv_bytes_per_element: float) -> int:
    """K and V of ``attended_len`` positions read (a sliding-window layer's ring: at most its window), plus one
    position written, over every layer."""
    per_position = 2 * cfg.n_kv_heads * cfg.head_dim * kv_bytes_per_element  # K and V of one layer
    read = sum(min(attended_len, cfg.window(i)) if cfg.window(i) else attended_len for i in range(cfg.n_layers))
    return int(round(per_position * (read + cfg.n_layers)))


def mean_attended_len(context_len: int, new_tokens: int) -> float:
    """Positions attended on average while decoding ``new_tokens`` after a prompt of ``context_len``.

    Decode step i (0-based) feeds the token at position context_len + i and attends to positions
    [0, context_len + i], i.e. context_len + i + 1 of them.
    """
    return context_len + (new_tokens + 1) / 2


def decode_bytes(cfg: ModelConfig, weights: ModelWeights, attended_len: float, kv_bytes_per_element: float) -> DecodeBytes:
    return DecodeBytes(
        weights=weight_bytes_per_token(weights),
        kv_cache=kv_bytes_per_token(cfg, attended_len, kv_bytes_per_element),
        attended_len=attended_len,
    )


def roofline_tokens_per_s(bytes_per_token: int, bandwidth_bytes_per_s: float) -> float:
    """The most tokens per second the bandwidth allows when every byte is read once."""
    if bytes_per_token <= 0:
        raise ValueError(f"bytes per token must be positive, got {bytes_per_token}")
    return bandwidth_bytes_per_s / bytes_per_token


def roofline_fraction(tokens_per_s: float, bytes_per_token: int, bandwidth_bytes_per_s: float) -> float:
    """Measured tokens/s over the roofline's: 1.0 means streaming at the copy bandwidth."""
    return tokens_per_s / roofline_tokens_per_s(bytes_per_token, bandwidth_bytes_per_s)
