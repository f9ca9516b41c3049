"""CUDA-graph replay of the prefill, one graph per (batch, bucket): the first token without eager launches.

An eager prefill launches every operator of every layer from Python (~20 µs
each on the GPU machine, more on an Orin's ARM cores), so a short prompt's
time to first token is launch-bound: 34 ms for 512 tokens of a 135M model on
the H200, against ~2 ms replayed as a graph (scripts/bench_decode_vs_llamacpp.py).
Static buckets make one graph per bucket possible. ``capture(B, T)`` records a
bucket ahead of the request (a server does it at start-up, ``run`` before it
starts the clock); a bucket met without one is captured on first use.
"""

from __future__ import annotations

import torch

from edgekit.model.decoder import Decoder
from edgekit.model.kv_cache import StaticKVCache
from edgekit.runtime.gpu_admin_lock import capture_graph, gpu_admin_work, side_stream


class GraphedPrefill:
    """Callable like ``Decoder.prefill(tokens, seq_lens, cache)``, for the one cache it was made with."""

    def __init__(self, decoder: Decoder, cache: StaticKVCache):
        if decoder.device.type != "cuda":
            raise ValueError("CUDA graphs need the decoder on a CUDA device")
        self.decoder = decoder
        self.cache = cache
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def capture(self, batch: int, bucket: int) -> None:
        """Record the prefill of a (batch, bucket) input. Writes cache positions [0, bucket), as any prefill does."""
        if (batch, bucket) in self._graphs:
            return
        dev = self.decoder.device
        tokens = torch.zeros(batch, bucket, dtype=torch.long, device=dev)  # (B, T) static input
        seq_lens = torch.full((batch,), bucket, dtype=torch.long, device=dev)  # (B,)
        with gpu_admin_work():  # warm-up and capture never overlap other admin GPU work (gpu_admin_lock)
            side = side_stream()  # pinned to a green context's stream where one is (gpu_admin_lock)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up off the capture: Triton JIT, lazy loads, allocator
                self.decoder.prefill(tokens, seq_lens, self.cache)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with capture_graph(graph):
                logits = self.decoder.prefill(tokens, seq_lens, self.cache)  # (B, V) static output
        self._graphs[(batch, bucket)] = (graph, tokens, seq_lens, logits)

    def buckets(self) -> list[tuple[int, int]]:
        return sorted(self._graphs)

    def __call__(self, tokens: torch.Tensor, seq_lens: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
        if cache is not self.cache:
            raise ValueError("a GraphedPrefill replays into the cache it was captured with")
        B, T = tokens.shape
        self.capture(B, T)
        graph, tok_buf, len_buf, logits = self._graphs[(B, T)]
        tok_buf.copy_(tokens)
        len_buf.copy_(seq_lens)
        graph.replay()
        return logits
