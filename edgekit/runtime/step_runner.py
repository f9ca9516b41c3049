"""Prefill and decode steps over one shared KV cache of ``max(batch_buckets)`` rows, for the serving engine.

The engine keeps up to B sequences in flight, one per cache row ("slot"). A
new request is prefilled into its own row (batch 1, its prompt bucket) while
the others wait one step; a decode step then runs the first b rows together,
b the smallest batch bucket (1, 2, 4, ...) that covers every occupied row.

Two runners with one interface, each bound to one dispatch table:
- ``EagerRunner`` calls the decoder (CPU, or a GPU with graphs off);
- ``GraphedRunner`` replays CUDA graphs: one decode graph per batch bucket and
  one prefill graph per prompt bucket, the same static shapes ``edgekit run``
  replays. An operator swap builds a new runner off the serving path (warm-up
  on a scratch cache, so the live rows are never written; capture only records
  kernels) and the engine switches to it between two steps.
"""

from __future__ import annotations

import torch

from edgekit.kernels.dispatch import DispatchTable
from edgekit.model.decoder import Decoder
from edgekit.model.kv_cache import StaticKVCache


def rows_view(cache: StaticKVCache, rows: int) -> StaticKVCache:
    """The first `rows` rows of a cache, sharing its memory (a batch-`rows` cache for the decoder)."""
    view = object.__new__(type(cache))
    view.__dict__.update(cache.__dict__)
    view.k = [t[:rows] for t in cache.k]
    view.v = [t[:rows] for t in cache.v]
    view.batch = rows
    return view


class RowPrefillCache:
    """A batch-1 prefill writes its keys/values into row ``slot`` of the shared cache.

    The row index is a device tensor, not a Python int, so one captured prefill
    graph per prompt bucket serves every slot (the slot is an input, like the tokens)."""

    def __init__(self, cache: StaticKVCache, slot: torch.Tensor):
        self.cache, self.slot = cache, slot  # slot: (1,) long on the cache's device
        self.batch, self.max_seq_len = 1, cache.max_seq_len

    def write_prefix(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        T = k.shape[2]
        self.cache.k[layer][self.slot, :, :T] = k  # (1, Hkv, T, D) into row `slot`
        self.cache.v[layer][self.slot, :, :T] = v


class EagerRunner:
    def __init__(self, decoder: Decoder, table: DispatchTable, cache: StaticKVCache, batch_buckets: tuple[int, ...],
                 step=None):
        self.table = table
        self.decoder = decoder.with_ops(table)
        self.step = step or self.decoder  # what a decode step calls: the decoder, or the fused path's FusedDecoder
        self.cache = cache
        self.views = {b: rows_view(cache, b) for b in batch_buckets}
        self.graphed = False

    def prefill(self, slot: int, tokens: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """tokens (1, T), seq_lens (1,) -> logits (1, V); keys and values land in row `slot`."""
        row = torch.tensor([slot], dtype=torch.long, device=self.cache.k[0].device)
        return self.decoder.prefill(tokens, seq_lens, RowPrefillCache(self.cache, row))

    def decode(self, batch: int, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens (b,), positions (b,) for rows [0, b) -> logits (b, V)."""
        return self.step.decode(tokens, positions, self.views[batch])


class _Graph:
    """One captured step with its static input buffers and output."""

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: tuple[torch.Tensor, ...], output: torch.Tensor):
        self.graph, self.inputs, self.output = graph, inputs, output

    def __call__(self, *values: torch.Tensor) -> torch.Tensor:
        for buf, v in zip(self.inputs, values):
            buf.copy_(v)
        self.graph.replay()
        return self.output


class GraphedRunner:
    """CUDA-graph replay of every decode batch bucket and every prefill prompt bucket for one table."""

    def __init__(self, decoder: Decoder, table: DispatchTable, cache: StaticKVCache, batch_buckets: tuple[int, ...],
                 prompt_buckets: tuple[int, ...], warmup: int = 2, step=None):
        if decoder.device.type != "cuda":
            raise ValueError("CUDA graphs need the decoder on a CUDA device")
        self.table, self.cache, self.graphed = table, cache, True
        dec = decoder.with_ops(table)
        step = step or dec  # the decode graphs capture the fused path's FusedDecoder when it runs
        dev = decoder.device
        scratch = decoder.new_cache(cache.batch, cache.max_seq_len)  # warm-up never writes the live rows
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        self.decode_graphs: dict[int, _Graph] = {}
        self.prefill_graphs: dict[int, _Graph] = {}
        with torch.cuda.stream(side):
            for b in batch_buckets:
                tokens = torch.zeros(b, dtype=torch.long, device=dev)  # (b,)
                positions = torch.zeros(b, dtype=torch.long, device=dev)  # (b,)
                for _ in range(warmup):
                    step.decode(tokens, positions, rows_view(scratch, b))
                self.decode_graphs[b] = self._capture(side, lambda: step.decode(tokens, positions, rows_view(cache, b)),
                                                      (tokens, positions))
            for T in prompt_buckets:
                tokens = torch.zeros(1, T, dtype=torch.long, device=dev)  # (1, T)
                seq_lens = torch.ones(1, dtype=torch.long, device=dev)  # (1,)
                slot = torch.zeros(1, dtype=torch.long, device=dev)  # (1,)
                for _ in range(warmup):
                    dec.prefill(tokens, seq_lens, RowPrefillCache(scratch, slot))
                self.prefill_graphs[T] = self._capture(side, lambda: dec.prefill(tokens, seq_lens, RowPrefillCache(cache, slot)),
                                                       (tokens, seq_lens, slot))
        side.synchronize()
        del scratch

    @staticmethod
    def _capture(stream: torch.cuda.Stream, step, inputs) -> _Graph:
        g = torch.cuda.CUDAGraph()
        # thread_local: the serving thread keeps launching (and allocating) while this thread captures
        with torch.cuda.graph(g, stream=stream, capture_error_mode="thread_local"):
            out = step()
        return _Graph(g, inputs, out)

    def prefill(self, slot: int, tokens: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        row = torch.tensor([slot], dtype=torch.long, device=tokens.device)
        return self.prefill_graphs[tokens.shape[1]](tokens, seq_lens, row)

    def decode(self, batch: int, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.decode_graphs[batch](tokens, positions)


def make_runner(decoder: Decoder, table: DispatchTable, cache: StaticKVCache, batch_buckets: tuple[int, ...],
                prompt_buckets: tuple[int, ...], graphs: bool, step=None):
    """A runner for ``table``; ``step`` is what its decode steps call (default: the decoder on ``table``)."""
    if graphs:
        return GraphedRunner(decoder, table, cache, batch_buckets, prompt_buckets, step=step)
    return EagerRunner(decoder, table, cache, batch_buckets, step=step)
