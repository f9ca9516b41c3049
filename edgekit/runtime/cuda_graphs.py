"""CUDA-graph replay of the decode step: one launch from the CPU per token instead of hundreds.

An eager decode step launches every operator from Python (~20 µs each on the
GPU machine, more on an Orin's ARM cores), so a small model is launch-bound.
With static shapes the whole step can be captured once per batch size and
replayed. A captured graph holds the kernels it was captured with: after an
operator swap, capture a new graph off the serving path and switch to it
(``capture`` again with the new table, then replace the step).
"""

from __future__ import annotations

import torch

from edgekit.model.decoder import Decoder
from edgekit.model.kv_cache import StaticKVCache
from edgekit.runtime.gpu_admin_lock import capture_graph, gpu_admin_work, side_stream


class GraphedDecodeStep:
    def __init__(self, decoder: Decoder, cache: StaticKVCache, warmup: int = 2):
        if decoder.device.type != "cuda":
            raise ValueError("CUDA graphs need the decoder on a CUDA device")
        B = cache.batch
        dev = decoder.device
        # kept as long as the graph: the graph replays raw addresses, and a decode step may own device memory made
        # outside the capture (see step_runner._DecodeBucket)
        self.decoder = decoder
        self.tokens = torch.zeros(B, dtype=torch.long, device=dev)  # (B,)
        self.positions = torch.zeros(B, dtype=torch.long, device=dev)  # (B,)
        # Warm up on a side stream (allocations, autotuning, lazy module loads) before capture.
        # These steps write position 0 of the cache, which every prefill overwrites.
        with gpu_admin_work():  # warm-up and capture never overlap other admin GPU work (gpu_admin_lock)
            side = side_stream()  # pinned to a green context's stream where one is (gpu_admin_lock)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    decoder.decode(self.tokens, self.positions, cache)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with capture_graph(self.graph):
                self.logits = decoder.decode(self.tokens, self.positions, cache)  # (B, V), a static output buffer

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.tokens.copy_(tokens)
        self.positions.copy_(positions)
        self.graph.replay()
        return self.logits
