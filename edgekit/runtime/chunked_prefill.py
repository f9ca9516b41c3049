"""Chunked prefill: a long prompt enters its KV-cache row a chunk at a time, between the other rows' decode steps.

A whole-prompt prefill runs on the device thread in one piece: a 2046-token
prompt stalled every stream of the server for ~70 s on a CPU (#32). The engine
instead runs at most one chunk per loop turn, then a decode step of the rows
already answering, so no stream pauses for longer than one chunk.

A chunk is the decoder's own block (the dispatch table's rmsnorm, qkv_rope,
linear and swiglu, plugins included) over tokens [start, start + C) of one row:
their keys and values are written into the row at those positions, and the
chunk's queries attend to the row's cache up to their own position (causal, as
the prefill). That attention is the torch math (``attend_chunk``), not the
``attention_prefill`` operator, whose kernels attend within one padded bucket.
"""

from __future__ import annotations

import torch

from edgekit.kernels.attention import default_scale
from edgekit.kernels.precision import accumulate_dtype
from edgekit.model.decoder import Decoder
from edgekit.model.embedding import lookup
from edgekit.model.kv_cache import StaticKVCache


def _row_window(cache: StaticKVCache, slot: int, start: int, stop: int | None) -> StaticKVCache:
    """Row ``slot`` of ``cache`` from position ``start`` to ``stop`` as a batch-1 cache sharing its memory: its
    ``write_prefix`` writes at ``start``, its ``layer`` reads [start, stop). A quantized cache keeps its scales."""
    view = object.__new__(type(cache))
    view.__dict__.update(cache.__dict__)
    view.k = [t[slot : slot + 1, :, start:stop] for t in cache.k]
    view.v = [t[slot : slot + 1, :, start:stop] for t in cache.v]
    view.batch = 1
    return view


def attend_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """Queries of positions [start, start + C) over keys [0, S) of one row, causal: q (1, Hq, C, D), k and v
    (1, Hkv, S, D) with S = start + C. Returns (1, Hq, C, D). Query heads are grouped by the KV head they read,
    so K and V are never copied per query head."""
    _, Hq, C, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    acc = accumulate_dtype(q.dtype)
    qg = q.to(acc).reshape(1, Hkv, (Hq // Hkv) * C, D)  # (1, Hkv, G*C, D): head h reads KV head h // G
    scores = (qg @ k.to(acc).transpose(-1, -2)) * default_scale(D)  # (1, Hkv, G*C, S)
    q_pos = start + torch.arange(C, device=q.device).repeat(Hq // Hkv)  # (G*C,)
    allowed = torch.arange(S, device=q.device)[None, :] <= q_pos[:, None]  # (G*C, S)
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return (probs @ v.to(acc)).reshape(1, Hq, C, D).to(q.dtype)


@torch.no_grad()
def prefill_chunk(decoder: Decoder, cache: StaticKVCache, slot: int, tokens: torch.Tensor, start: int) -> torch.Tensor:
    """Prompt tokens (1, C) at positions [start, start + C) of row ``slot``, after [0, start) are in the cache.
    Their keys and values land in the row; returns the logits of the chunk's last token (1, V)."""
    cfg = decoder.config
    C = tokens.shape[1]
    x = lookup(decoder.weights.tok_embeddings, tokens)  # (1, C, hidden)
    cos, sin = decoder._cos[start : start + C][None], decoder._sin[start : start + C][None]  # (1, C, D/2)
    written = _row_window(cache, slot, start, None)
    seen = _row_window(cache, slot, 0, start + C)
    for i, b in enumerate(decoder.weights.blocks):

        def attend(h, i=i, b=b):
            q, k, v = decoder.ops.qkv_rope(h, b.wqkv, cos, sin, cfg.n_heads, cfg.n_kv_heads)  # (1, H, C, D)
            written.write_prefix(i, k, v)
            k_all, v_all = seen.layer(i)  # (1, Hkv, start + C, D), as decode reads them (dequantized if INT8)
            return attend_chunk(q, k_all, v_all, start).transpose(1, 2).reshape(1, C, cfg.q_size)

        x = decoder._block(b, x, attend)
    return decoder._logits(x[:, -1])  # (1, V)
