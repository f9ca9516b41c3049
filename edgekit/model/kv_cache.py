"""A preallocated, fixed-size KV cache: memory is known before the first token."""

from __future__ import annotations

import torch

from edgekit.model.config import ModelConfig


def new_split_arrivals(config: ModelConfig, batch: int, device) -> list[torch.Tensor]:
    """The split-KV attention's arrival counters (fused_attn_proj_residual), one (B, Hkv) int32 set a layer: zero,
    and every decode step leaves them at zero. They live with the cache because a step's graph replays their
    addresses, as it replays the cache's (one tensor a layer, as k and v: compiled kernels take 16-byte aligned
    pointers)."""
    return [torch.zeros(batch, config.n_kv_heads, dtype=torch.int32, device=device) for _ in range(config.n_layers)]


class StaticKVCache:
    def __init__(self, config: ModelConfig, batch: int, max_seq_len: int, dtype: torch.dtype, device="cpu"):
        shape = (batch, config.n_kv_heads, max_seq_len, config.head_dim)  # (B, Hkv, S, D)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layers)]
        self.batch = batch
        self.max_seq_len = max_seq_len
        self.split_arrivals = new_split_arrivals(config, batch, device)

    def write_prefix(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write a prefill chunk (B, Hkv, T, D) at positions [0, T)."""
        T = k.shape[2]
        self.k[layer][:, :, :T] = k
        self.v[layer][:, :, :T] = v

    def write_token(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> None:
        """Write one token per sequence (B, Hkv, 1, D) at its own position (B,)."""
        rows = torch.arange(self.batch, device=positions.device)
        self.k[layer][rows, :, positions] = k[:, :, 0]
        self.v[layer][rows, :, positions] = v[:, :, 0]

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) of one layer as the attention operator reads them, (B, Hkv, S, D) each.

        A quantized cache overrides this to return dequantized views."""
        return self.k[layer], self.v[layer]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)
