"""Chunked prefill: a long prompt enters its KV-cache row a chunk at a time, between the other rows' decode steps.

Also how ``edgekit run`` / ``generate`` (edgekit/generate.py) take a prompt longer than the largest bucket. It
lives with the model (the decoder's graph, cache and tables are all it reads) so both the server's runtime and the
generator use it without the generator importing the runtime.

A whole-prompt prefill runs on the device thread in one piece: a 2046-token
prompt stalled every stream of the server for ~70 s on a CPU (#32). The engine
instead runs at most one chunk per loop turn, then a decode step of the rows
already answering, so no stream pauses for longer than one chunk.

A chunk is the model's own prefill graph (the one declared forward, docs/architecture.md)
walked over tokens [start, start + C) of one row, with three things of the step
changed: the RoPE rows start at ``start``, the keys and values land in the row
at those positions, and attention reads the row's earlier positions (those its
queries may see) before the chunk's own (causal, as the prefill; within the
window for a sliding-window layer). That attention is the torch math
(``attend_chunk``), not the ``attention_prefill`` operator, whose kernels attend
within one padded bucket; every other node runs through the decoder's dispatch
table, plugins included.

A sliding-window layer (Gemma 3's local layers) keeps a ring of R = min(window,
max_seq_len) rows, position p in row p % R. A chunk reads the R - 1 positions
before it from the ring (the most a query of the chunk may see besides its own
chunk's) before its own positions overwrite the oldest rows, and writes its last
R positions at their rows; a full-attention layer is the same rule with R rows
for every position (nothing wraps).
"""

from __future__ import annotations

import dataclasses

import torch

from edgekit.graph.executor import run_graph
from edgekit.graph.node import PREFILL
from edgekit.kernels.precision import accumulate_dtype
from edgekit.model.decoder import Decoder
from edgekit.model.kv_cache import StaticKVCache


def _row_rows(cache: StaticKVCache, slot: int, layer: int, first: int, stop: int) -> StaticKVCache:
    """Rows [first, stop) of row ``slot``'s ``layer`` as a batch-1 cache sharing the memory (every other layer
    empty): its ``write_prefix`` writes at ``first``, its ``layer`` reads those rows (a quantized cache keeps its
    scales and dequantizes them)."""
    view = object.__new__(type(cache))
    view.__dict__.update(cache.__dict__)
    view.k = [t[slot : slot + 1, :, first:stop] if i == layer else t[:0] for i, t in enumerate(cache.k)]
    view.v = [t[slot : slot + 1, :, first:stop] if i == layer else t[:0] for i, t in enumerate(cache.v)]
    view.batch = 1
    return view


class ChunkRow:
    """Row ``slot`` of ``cache`` as one chunk of positions [start, start + C) writes and reads it."""

    def __init__(self, cache: StaticKVCache, slot: int, start: int):
        self.cache, self.slot, self.start = cache, slot, start
        self.batch, self.max_seq_len = 1, cache.max_seq_len

    def _rows(self, layer: int) -> int:
        return self.cache.k[layer].shape[2]

    def history(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) (1, Hkv, P, D) of the positions before the chunk its queries may see, oldest first, as decode
        reads them: [start - R + 1, start) of a ring of R rows, [0, start) of a full-attention layer."""
        R = self._rows(layer)
        first = max(0, self.start - R + 1)
        if self.start <= R:  # not wrapped: position p in row p
            return _row_rows(self.cache, self.slot, layer, first, self.start).layer(layer)
        k, v = _row_rows(self.cache, self.slot, layer, 0, R).layer(layer)  # (1, Hkv, R, D)
        rows = torch.remainder(torch.arange(first, self.start, device=k.device), R)
        return k.index_select(2, rows), v.index_select(2, rows)

    def write_prefix(self, layer: int, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor | None = None) -> None:
        """The chunk's keys and values (1, Hkv, C, D), every position real: its last R positions, position p at row
        p % R (at most two runs of rows: up to the ring's end, then from its start)."""
        R, C = self._rows(layer), k.shape[2]
        keep = min(C, R)
        p = self.start + C - keep  # the first position kept
        while keep:
            row = p % R
            n = min(keep, R - row)
            at = p - self.start  # position p's index in the chunk
            _row_rows(self.cache, self.slot, layer, row, row + n).write_prefix(layer, k[:, :, at : at + n],
                                                                                v[:, :, at : at + n])
            p, keep = p + n, keep - n


# Score elements a step of a chunk's attention holds: its keys are taken SCORE_ELEMENTS // (Hq x C) at a time (at
# least one), so each of its FP32 scores, masked scores and probabilities is at most 16 MiB. In one piece, a 512-token
# chunk of qwen3-1.7b at depth 4096 held 3 x 128 MiB of them (16 heads x 512 x 4096 x 4 B each), over what the memory
# plan counts for a prefill; a short slice (a server's, while rows decode) still takes its keys in a few long steps,
# not in many short ones that would each pay ~30 operations' launch cost.
SCORE_ELEMENTS = 4 * 1024 * 1024


def attend_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float,
                 window: int = 0) -> torch.Tensor:
    """Queries of positions [start, start + C) of one row over the S keys of positions [start + C - S, start + C),
    causal, and within ``window`` positions if > 0: q (1, Hq, C, D), k and v (1, Hkv, S, D). Returns (1, Hq, C, D).
    Query heads are grouped by the KV head they read, so K and V are never copied per query head. The keys go in
    blocks (SCORE_ELEMENTS) with an online softmax (running max and sum, as flash attention), in FP32 (FP64 for an
    FP64 run)."""
    _, Hq, C, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    acc = accumulate_dtype(q.dtype)
    qg = q.to(acc).reshape(1, Hkv, (Hq // Hkv) * C, D)  # (1, Hkv, G*C, D): head h reads KV head h // G
    q_pos = start + torch.arange(C, device=q.device).repeat(Hq // Hkv)  # (G*C,)
    m = torch.full((1, Hkv, qg.shape[2], 1), float("-inf"), dtype=acc, device=q.device)  # running max
    den = torch.zeros_like(m)
    num = torch.zeros_like(qg)
    block = max(1, SCORE_ELEMENTS // (Hq * C))
    for j in range(0, S, block):
        kb, vb = k[:, :, j : j + block].to(acc), v[:, :, j : j + block].to(acc)  # (1, Hkv, Sb, D)
        k_pos = start + C - S + j + torch.arange(kb.shape[2], device=q.device)  # (Sb,)
        allowed = k_pos[None, :] <= q_pos[:, None]  # (G*C, Sb)
        if window:
            allowed &= q_pos[:, None] - k_pos[None, :] < window
        scores = ((qg @ kb.transpose(-1, -2)) * scale).masked_fill(~allowed, float("-inf"))  # (1, Hkv, G*C, Sb)
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        base = torch.where(m_new == float("-inf"), 0.0, m_new)  # a row with no visible key yet: no NaN
        p = torch.exp(scores - base)
        alpha = torch.exp(m - base)
        den = den * alpha + p.sum(-1, keepdim=True)
        num = num * alpha + p @ vb
        m = m_new
    return (num / den).reshape(1, Hq, C, D).to(q.dtype)  # every query sees its own key: den > 0


# The prefill graph's operators a chunk answers itself rather than through the dispatch table (a plugin for one of
# them is not called by a chunked prompt: the serving stack's probation does not count such a request for it)
CHUNK_ANSWERS = frozenset({"attention_prefill"})


class _ChunkOps:
    """The decoder's dispatch table, with ``attention_prefill`` (CHUNK_ANSWERS) answered for a chunk starting at
    ``start``."""

    def __init__(self, ops, start: int):
        self._ops, self._start = ops, start

    def get(self, name: str):
        if name == "attention_prefill":
            return lambda q, k, v, seq_lens, scale, window=0: attend_chunk(q, k, v, self._start, scale, window)
        return self._ops.get(name)


@torch.no_grad()
def prefill_chunk(decoder: Decoder, cache: StaticKVCache, slot: int, tokens: torch.Tensor, start: int) -> torch.Tensor:
    """Prompt tokens (1, C) at positions [start, start + C) of row ``slot``, after [0, start) are in the cache.
    Their keys and values land in the row; returns the logits of the chunk's last token (1, V)."""
    C = tokens.shape[1]
    graph = decoder.graph(PREFILL)
    row = ChunkRow(cache, slot, start)
    ctx = dataclasses.replace(
        decoder.context(PREFILL, row, tokens=tokens, seq_lens=torch.tensor([C], dtype=torch.int32, device=tokens.device)),
        ops=_ChunkOps(decoder.ops, start),
        tables=lambda name: tuple(t[start:] for t in decoder.rope_tables(name, cache.max_seq_len)),
        kv_history=row.history)
    return run_graph(graph, ctx)[graph.outputs["logits"]]  # (1, V)
