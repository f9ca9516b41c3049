"""The persistent decode path: one kernel launch per decoder layer (kernels/persistent_decode_triton.py).

Each layer's five fused stages (QKV + RoPE + cache write, split-KV attention,
combine + o-proj + residual, norm + gate/up + SwiGLU, down + residual) run in
one launch of one program per SM with grid barriers between them; the token's
head is still ``fused_head_argmax``. So a token costs n_layers + 5 launches
(embedding gather, sequence lengths, head + argmax reduce), replayed as one CUDA
graph like the fused path.

The kernel is built from edgekit's own fused kernels (their stage functions),
so it stands in for the fused operators only while the table runs exactly
those: once any fused operator, or an operator they subsume, is swapped (an
over-the-air plugin), ``persistent_path_blocker`` says why and the runtime
falls back to the fused super-operators (still graphed) until a persistent
kernel built with the new operator is delivered.
"""

from __future__ import annotations

from typing import Mapping

import torch

from edgekit.kernels.dispatch import DispatchTable
from edgekit.model.decoder import Decoder
from edgekit.model.embedding import lookup
from edgekit.model.kv_cache import StaticKVCache
from edgekit.runtime.fused_step import STEP, FusedDecoder, seq_lens_of
from edgekit.runtime.fused_step import _float_or_int8_weights, _weights

LAUNCHES_PER_LAYER = 1
LAUNCHES_PER_TOKEN = 4  # as the fused path: embedding gather, positions + 1 (written as int32), head GEMV, argmax reduce


# The projections the persistent kernel's stages take: float, or INT8 with a per-channel scale. INT4 (W4A16) weights
# run on the fused super-operators (their INT4 kernels are not stages of the persistent kernel yet).
PERSISTENT_WEIGHT_OPS = ("linear", "linear_w8a16")


def persistent_weights_blocker(weights) -> str | None:
    """Why the persistent kernel cannot take these model weights (None: it can), e.g. INT4 (W4A16) projections."""
    for i, b in enumerate(weights.blocks):
        for name, lw in b.linears().items():
            if lw.op not in PERSISTENT_WEIGHT_OPS:
                return (f"layer {i} {name} uses {lw.op}; the persistent kernel takes float or W8A16 weights "
                        f"({', '.join(PERSISTENT_WEIGHT_OPS)}), so decode runs on the fused super-operators, which take it")
    return None


def persistent_path_blocker(table: DispatchTable, baseline: Mapping[str, str] | None) -> str | None:
    """Why the persistent kernel cannot stand in for the fused operators of ``table`` (None: it can).

    ``table`` is the fused path's table (fused entries resolved). A swap of an operator the fused operators
    subsume is already ruled out by ``fused_path_blocker`` against ``baseline``; a fused operator swapped since
    ``baseline`` (a plugin version the bundle did not ship) is no longer the kernel the persistent launch contains.
    """
    sources = table.sources()
    for op in STEP.own_operators():
        # edgekit's own kernels: JIT-compiled here, or the bundle's shipped plugin as it was at open (not swapped)
        own = sources.get(op) == "triton" or (baseline is not None and sources.get(op) == baseline.get(op)
                                              and str(sources.get(op)).startswith("plugin:"))
        if not own:
            return (f"{op} runs {sources.get(op)}; the persistent kernel is built from edgekit's own fused kernels, so "
                    f"decode runs on the fused super-operators until a persistent kernel with that operator arrives")
    return None


class PersistentDecoder(FusedDecoder):
    """A decode step of one persistent launch per layer plus the fused head; quacks like a Decoder."""

    def __init__(self, decoder: Decoder, ops: DispatchTable | None = None):
        from edgekit.kernels.persistent_decode_triton import LayerWeights, layer_tiles, new_sync

        super().__init__(decoder, ops)
        self.pdl = 0  # plain launches: its grid barriers were never measured beside programmatic dependent launch
        # Triton's CPU interpreter runs programs one after another, so a grid barrier would spin for good there:
        # off a GPU each layer is the kernel's five staged launches (same stage functions, no barrier)
        self.staged = self.device.type != "cuda"
        self.sync = new_sync(self.device)  # the grid barrier's counter: every launch leaves it at zero
        self.layers, self.tiles, made = [], [], {}
        for b in decoder.weights.blocks:
            int8 = tuple((name, lw.op == "linear_w8a16")
                         for name, lw in (("qkv", b.wqkv), ("o", b.wo), ("gate_up", b.w_gate_up), ("down", b.w_down)))
            if int8 not in made:  # the fused operators' tiles for this layer's weight precisions
                made[int8] = layer_tiles(self.config, dict(int8))
            self.tiles.append(made[int8])
            wqkv, sqkv, bqkv = _float_or_int8_weights(b.wqkv)
            wo, so, bo = _float_or_int8_weights(b.wo)
            wgu, sgu, _ = _float_or_int8_weights(b.w_gate_up)
            wd, sd, bd = _float_or_int8_weights(b.w_down)
            self.layers.append(LayerWeights(b.attn_norm, wqkv, sqkv, bqkv, wo, so, bo, b.ffn_norm, wgu, sgu, wd, sd, bd))

    @torch.no_grad()
    def decode_token(self, tokens: torch.Tensor, positions: torch.Tensor, cache: StaticKVCache):
        from edgekit.kernels.attention import default_scale
        from edgekit.kernels.persistent_decode_triton import persistent_layer

        cfg, w = self.config, self.decoder.weights
        x = lookup(w.tok_embeddings, tokens)  # (B, C)
        seq_lens = seq_lens_of(positions)  # (B,)
        cos, sin = self.decoder._cos, self.decoder._sin  # (S, D/2)
        for i, (lw, tiles) in enumerate(zip(self.layers, self.tiles)):
            x = persistent_layer(x, lw, cos, sin, positions, seq_lens, cache.k[i], cache.v[i], self.sync,
                                 eps=cfg.rms_norm_eps, sm_scale=default_scale(cfg.head_dim), n_heads=cfg.n_heads,
                                 n_kv_heads=cfg.n_kv_heads, tiles=tiles, staged=self.staged)  # (B, C)
        token, logits = self.ops.get("fused_head_argmax")(x, w.norm, *_weights(w.lm_head), cfg.rms_norm_eps)
        self.last_token = token
        return token, logits
