"""The fused decode step: the decode graph rewritten by the fused operators' patterns, run through the dispatch table.

``FusedDecoder`` runs ``graph.paths``' fused decode graph (the planner ships and
counts the same operators); ``runtime.fused_decode`` decides when it runs.
"""

from __future__ import annotations

import torch

from edgekit.graph.executor import run_graph
from edgekit.graph.node import DECODE
from edgekit.graph.paths import FUSED
from edgekit.kernels.dispatch import DispatchTable
from edgekit.kernels.pdl_launch import auto_level, step_launches
from edgekit.model.decoder import Decoder
from edgekit.model.kv_cache import StaticKVCache


def weight_bytes_per_kernel(weights) -> float:
    """Mean weight bytes one layer GEMV kernel of the step reads (qkv, o, gate/up, down; scales and offsets included)."""
    mats = [lw for b in weights.blocks for lw in b.linears().values()]
    total = sum(lw.weight.nbytes + sum(t.nbytes for t in (lw.scale, lw.offset) if t is not None) for lw in mats)
    return total / max(1, len(mats))


class FusedDecoder:
    """A decode step on the fused path's graph; quacks like a Decoder for ``GraphedDecodeStep``.

    Shares the decoder's weights, RoPE tables and config; calls every operator through ``ops``.
    """

    def __init__(self, decoder: Decoder, ops: DispatchTable | None = None):
        self.decoder = decoder
        self.ops = ops or decoder.ops
        self.config = decoder.config
        self.device = decoder.device
        self.dtype = decoder.dtype
        self.graph = decoder.graph(DECODE, FUSED)
        self.last_token: torch.Tensor | None = None  # (B,) greedy tokens of the last step, on the device
        # programmatic dependent launch on sm_90+ (kernels/pdl_launch.py): for every kernel when they are short, for
        # the attention operators' launches only when they are not (measured on the H200: pdl_launch.auto_level)
        self.pdl = auto_level(weight_bytes_per_kernel(decoder.weights))

    def new_cache(self, batch: int, max_seq_len: int) -> StaticKVCache:
        return self.decoder.new_cache(batch, max_seq_len)

    @torch.no_grad()
    def decode_token(self, tokens: torch.Tensor, positions: torch.Tensor, cache: StaticKVCache):
        """tokens (B,) at positions (B,): one step. Returns (greedy token (B,), logits (B, V)), both on the device."""
        ctx = self.decoder.context(DECODE, cache, tokens=tokens, positions=positions)
        ctx.ops = self.ops
        with step_launches(self.pdl):
            env = run_graph(self.graph, ctx)
        logits = env[self.graph.outputs["logits"]]
        # the fused head picks the token on the device; a head it does not take leaves the pick to one argmax
        token = env[self.graph.outputs["token"]] if "token" in self.graph.outputs else logits.argmax(-1)
        self.last_token = token
        return token, logits

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
        """Decoder.decode's contract: logits (B, V). The greedy token is in ``last_token``."""
        return self.decode_token(tokens, positions, cache)[1]
