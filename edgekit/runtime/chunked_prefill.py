"""Chunked prefill: a long prompt enters its KV-cache row a chunk at a time, between the other rows' decode steps.

A whole-prompt prefill runs on the device thread in one piece: a 2046-token
prompt stalled every stream of the server for ~70 s on a CPU (#32). The engine
instead runs at most one chunk per loop turn, then a decode step of the rows
already answering, so no stream pauses for longer than one chunk.

A chunk is the model's own prefill graph (the one declared forward, docs/architecture.md)
walked over tokens [start, start + C) of one row, with three things of the step
changed: the RoPE rows start at ``start``, the keys and values land in the row
at those positions, and attention reads the row's cache up to the chunk's last
position (causal, as the prefill). That attention is the torch math
(``attend_chunk``), not the ``attention_prefill`` operator, whose kernels attend
within one padded bucket; every other node runs through the decoder's dispatch
table, plugins included.
"""

from __future__ import annotations

import dataclasses

import torch

from edgekit.graph.executor import run_graph
from edgekit.graph.node import PREFILL
from edgekit.kernels.precision import accumulate_dtype
from edgekit.model.decoder import Decoder
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


def attend_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float) -> torch.Tensor:
    """Queries of positions [start, start + C) over keys [0, S) of one row, causal: q (1, Hq, C, D), k and v
    (1, Hkv, S, D) with S = start + C. Returns (1, Hq, C, D). Query heads are grouped by the KV head they read,
    so K and V are never copied per query head."""
    _, Hq, C, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    acc = accumulate_dtype(q.dtype)
    qg = q.to(acc).reshape(1, Hkv, (Hq // Hkv) * C, D)  # (1, Hkv, G*C, D): head h reads KV head h // G
    scores = (qg @ k.to(acc).transpose(-1, -2)) * scale  # (1, Hkv, G*C, S)
    q_pos = start + torch.arange(C, device=q.device).repeat(Hq // Hkv)  # (G*C,)
    allowed = torch.arange(S, device=q.device)[None, :] <= q_pos[:, None]  # (G*C, S)
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return (probs @ v.to(acc)).reshape(1, Hq, C, D).to(q.dtype)


class _ChunkOps:
    """The decoder's dispatch table, with ``attention_prefill`` answered for a chunk starting at ``start``."""

    def __init__(self, ops, start: int):
        self._ops, self._start = ops, start

    def get(self, name: str):
        if name == "attention_prefill":
            return lambda q, k, v, seq_lens, scale, window=0: attend_chunk(q, k, v, self._start, scale)
        return self._ops.get(name)


@torch.no_grad()
def prefill_chunk(decoder: Decoder, cache: StaticKVCache, slot: int, tokens: torch.Tensor, start: int) -> torch.Tensor:
    """Prompt tokens (1, C) at positions [start, start + C) of row ``slot``, after [0, start) are in the cache.
    Their keys and values land in the row; returns the logits of the chunk's last token (1, V)."""
    C = tokens.shape[1]
    graph = decoder.graph(PREFILL)
    seen = _row_window(cache, slot, 0, start + C)  # read as decode reads it (dequantized if INT8)
    ctx = dataclasses.replace(
        decoder.context(PREFILL, _row_window(cache, slot, start, None), tokens=tokens,
                        seq_lens=torch.tensor([C], dtype=torch.int32, device=tokens.device)),
        ops=_ChunkOps(decoder.ops, start),
        tables=lambda name: tuple(t[start:] for t in decoder.rope_tables(name)),
        kv_history=lambda layer: seen.layer(layer))
    return run_graph(graph, ctx)[graph.outputs["logits"]]  # (1, V)
