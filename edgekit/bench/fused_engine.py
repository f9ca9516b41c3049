"""edgekit's runtime on the fused decode path, as stepped bench engines beside the per-operator one.

Same contract as ``RuntimeEngine`` (prefill, decode fed back on the device,
graphed prefill); the decode step is ``FusedDecoder``'s: the greedy token comes
from the fused head's on-device argmax, so the step has no separate argmax.
"""

from __future__ import annotations

import torch

from edgekit.bench.engines import ENGINE_LABELS, GreedyFeedback, RuntimeEngine, SteppedEngine
from edgekit.errors import BenchmarkError
from edgekit.kernels.dispatch import DispatchTable
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import Decoder, ModelWeights
from edgekit.model.kv_cache import StaticKVCache

FUSED_ENGINE_LABEL = ENGINE_LABELS["edgekit-fused"]


class FusedGreedyFeedback(GreedyFeedback):
    """GreedyFeedback whose token comes from the fused head (no argmax over the logits), fed back in one launch."""

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
        from edgekit.kernels.decode_feedback_triton import feedback_step
        from edgekit.kernels.pdl_launch import step_launches

        nxt, _ = self.decoder.decode_token(tokens, positions, cache)  # (1,)
        with step_launches(self.decoder.pdl):  # as the step asks: in its PDL chain where every kernel is
            feedback_step(nxt, tokens, positions, self.count, self.out)  # one launch: record, feed back, advance
        return nxt


class FusedRuntimeEngine(RuntimeEngine):
    name = "edgekit-fused"
    decode_path = "fused"  # the path select_decode_path must give (else the engine refuses to run)

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, max_seq_len: int, max_tokens: int,
                 ops: DispatchTable | None = None):
        from edgekit.kernels.triton_backend import triton_dispatch_table
        from edgekit.runtime.cuda_graphs import GraphedDecodeStep
        from edgekit.runtime.fused_decode import select_decode_path

        SteppedEngine.__init__(self, cfg, Decoder(cfg, weights, ops or triton_dispatch_table()), max_seq_len, max_tokens)
        step_decoder, self.path = select_decode_path(self.decoder, self.cache, prefer=self.decode_path)
        if self.path.name != self.decode_path:
            raise BenchmarkError(f"the {self.decode_path} decode path cannot run here: {self.path.reason}")
        self.feedback = FusedGreedyFeedback(step_decoder, max_tokens)
        self.step = GraphedDecodeStep(self.feedback, self.cache)
        self._prefill_graphs = {}
