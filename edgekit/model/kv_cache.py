"""A preallocated, fixed-size KV cache: memory is known before the first token.

Each layer's K and V are (B, Hkv, rows, D). A full-attention layer has a row
per position (``max_seq_len``); a sliding-window layer (Gemma 3's local layers)
keeps a ring of ``min(window, max_seq_len)`` rows: position p lives in row
p % rows, so the ring always holds the last ``window`` positions, the only ones
its queries may see. Attention does not care in which order the rows hold
them: RoPE was applied to the keys before they were stored.
"""

from __future__ import annotations

import torch

from edgekit.errors import ShapeError
from edgekit.model.config import ModelConfig


def new_split_arrivals(config: ModelConfig, batch: int, device) -> list[torch.Tensor]:
    """The split-KV attention's arrival counters (fused_attn_proj_residual), one (B, Hkv) int32 set a layer: zero,
    and every decode step leaves them at zero. They live with the cache because a step's graph replays their
    addresses, as it replays the cache's (one tensor a layer, as k and v: compiled kernels take 16-byte aligned
    pointers)."""
    return [torch.zeros(batch, config.n_kv_heads, dtype=torch.int32, device=device) for _ in range(config.n_layers)]


def layer_shapes(config: ModelConfig, batch: int, max_seq_len: int) -> list[tuple[int, int, int, int]]:
    """(B, Hkv, rows, D) of every layer's K (and V) for ``max_seq_len`` positions."""
    return [(batch, config.n_kv_heads, config.kv_rows(i, max_seq_len), config.head_dim) for i in range(config.n_layers)]


def ring_prefix(k: torch.Tensor, v: torch.Tensor, rows: int, seq_lens: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """What a cache of ``rows`` rows keeps of a prefill chunk (B, Hkv, T, D), row by row from row 0.

    A chunk that fits is kept whole (positions [0, T) in rows [0, T)). A longer one (a sliding-window layer's ring)
    keeps, for each sequence, its last ``rows`` real positions p < seq_lens[b], each in row p % rows: the padding
    after a sequence's end must not evict the positions its next decode step attends to."""
    T = k.shape[2]
    if T <= rows:
        return k, v
    if seq_lens is None:
        raise ShapeError(f"a prefill chunk of {T} positions into a ring of {rows} rows needs the sequence lengths",
                         hint="this is a bug in edgekit: a sliding-window layer's kv_store binds @seq_lens")
    last = (seq_lens.to(device=k.device, dtype=torch.long) - 1)[:, None]  # (B, 1)
    slot = torch.arange(rows, device=k.device)[None]  # (1, R)
    pos = last - torch.remainder(last - slot, rows)  # (B, R): the latest real position of each row
    pos = torch.where(pos < 0, slot, pos)  # rows a short sequence never reached: any position (never attended)
    index = pos[:, None, :, None].expand(k.shape[0], k.shape[1], rows, k.shape[3])
    return k.gather(2, index), v.gather(2, index)


def copy_prompt_rows(src: "StaticKVCache", src_row: int, dst: "StaticKVCache", dst_row: int, n: int) -> None:
    """The keys/values of a prompt of ``n`` tokens prefilled into row ``src_row`` of ``src`` (a cache of at least
    ``n`` positions, of the same kind) to row ``dst_row`` of ``dst``: each layer's first min(n, its rows) rows. A
    ring shorter than the prompt holds the same rows in both (its window), so they are copied whole."""
    for layer in range(len(src.k)):
        rows = min(n, src.k[layer].shape[2])
        dst.k[layer][dst_row, :, :rows] = src.k[layer][src_row, :, :rows]
        dst.v[layer][dst_row, :, :rows] = src.v[layer][src_row, :, :rows]


class StaticKVCache:
    def __init__(self, config: ModelConfig, batch: int, max_seq_len: int, dtype: torch.dtype, device="cpu"):
        shapes = layer_shapes(config, batch, max_seq_len)
        self.k = [torch.zeros(s, dtype=dtype, device=device) for s in shapes]
        self.v = [torch.zeros(s, dtype=dtype, device=device) for s in shapes]
        self.batch = batch
        self.max_seq_len = max_seq_len
        self.split_arrivals = new_split_arrivals(config, batch, device)

    def write_prefix(self, layer: int, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor | None = None) -> None:
        """Write a prefill chunk (B, Hkv, T, D) at positions [0, T) (a ring: its last positions, ``ring_prefix``)."""
        k, v = ring_prefix(k, v, self.k[layer].shape[2], seq_lens)
        T = k.shape[2]
        self.k[layer][:, :, :T] = k
        self.v[layer][:, :, :T] = v

    def write_token(self, layer: int, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor) -> None:
        """Write one token per sequence (B, Hkv, 1, D) into its cache row (B,): its position, or position % window
        in a ring."""
        batch = torch.arange(self.batch, device=rows.device)
        self.k[layer][batch, :, rows] = k[:, :, 0]
        self.v[layer][batch, :, rows] = v[:, :, 0]

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) of one layer as the attention operator reads them, (B, Hkv, rows, D) each.

        A quantized cache overrides this to return dequantized views."""
        return self.k[layer], self.v[layer]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)
