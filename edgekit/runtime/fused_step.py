"""The fused decode step itself: a few super-operators per layer, called through the dispatch table.

``FusedDecoder`` runs ``kernels.decode_paths.FUSED_STEP`` (the planner ships and
counts the same operators); ``runtime.fused_decode`` decides when it runs.
"""

from __future__ import annotations

import torch

from edgekit.kernels.attention import default_scale
from edgekit.kernels.decode_paths import FUSED_STEP
from edgekit.kernels.dispatch import DispatchTable
from edgekit.kernels.linear import LinearWeights
from edgekit.kernels.pdl_triton import auto_level, step_launches
from edgekit.model.decoder import Decoder
from edgekit.model.embedding import lookup
from edgekit.model.kv_cache import StaticKVCache

# The step this module runs, described as data (the planner ships and counts the same operators)
STEP = FUSED_STEP


def _weights(lw: LinearWeights) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(weight, scale, offset, bias) as the layers' fused operators take them: scale None for float weights, the
    channel scale for INT8 (W8A16), group scales and offsets (None: symmetric) for packed INT4 (W4A16)."""
    scaled = lw.op in ("linear_w8a16", "linear_w4a16")
    return lw.weight, (lw.scale if scaled else None), (lw.offset if lw.op == "linear_w4a16" else None), lw.bias


def weight_bytes_per_kernel(weights) -> float:
    """Mean weight bytes one layer GEMV kernel of the step reads (qkv, o, gate/up, down; scales and offsets included)."""
    mats = [lw for b in weights.blocks for lw in (b.wqkv, b.wo, b.w_gate_up, b.w_down)]
    total = sum(lw.weight.nbytes + sum(t.nbytes for t in (lw.scale, lw.offset) if t is not None) for lw in mats)
    return total / max(1, len(mats))


def seq_lens_of(positions: torch.Tensor) -> torch.Tensor:
    """(B,) int32 attended lengths (position + 1) in one kernel: the add writes int32 (not an add, then a cast)."""
    seq_lens = torch.empty_like(positions, dtype=torch.int32)
    torch.add(positions, 1, out=seq_lens)
    return seq_lens


class FusedDecoder:
    """A decode step made of the fused super-operators; quacks like a Decoder for ``GraphedDecodeStep``.

    Shares the decoder's weights, RoPE tables and config; calls every operator through ``ops``.
    """

    def __init__(self, decoder: Decoder, ops: DispatchTable | None = None):
        self.decoder = decoder
        self.ops = ops or decoder.ops
        self.config = decoder.config
        self.device = decoder.device
        self.dtype = decoder.dtype
        self.last_token: torch.Tensor | None = None  # (B,) greedy tokens of the last step, on the device
        # programmatic dependent launch on sm_90+ (kernels/pdl_triton.py): pays when the kernels are short
        self.pdl = auto_level(weight_bytes_per_kernel(decoder.weights))

    def new_cache(self, batch: int, max_seq_len: int) -> StaticKVCache:
        return self.decoder.new_cache(batch, max_seq_len)

    @torch.no_grad()
    def decode_token(self, tokens: torch.Tensor, positions: torch.Tensor, cache: StaticKVCache):
        """tokens (B,) at positions (B,): one step. Returns (greedy token (B,), logits (B, V)), both on the device."""
        with step_launches(self.pdl):
            return self._decode_token(tokens, positions, cache)

    def _decode_token(self, tokens: torch.Tensor, positions: torch.Tensor, cache: StaticKVCache):
        cfg, w, get = self.config, self.decoder.weights, self.ops.get
        qkv_rope, attn_proj_residual = get("fused_norm_qkv_rope"), get("fused_attn_proj_residual")
        proj_residual, norm_swiglu = get("fused_proj_residual"), get("fused_norm_swiglu")
        eps, sm_scale = cfg.rms_norm_eps, default_scale(cfg.head_dim)
        x = lookup(w.tok_embeddings, tokens)  # (B, C)
        seq_lens = seq_lens_of(positions)  # (B,): once per step, not a cast per layer
        cos, sin = self.decoder._cos, self.decoder._sin  # (S, D/2): indexed by position inside the operator
        for i, b in enumerate(w.blocks):
            k_cache, v_cache = cache.k[i], cache.v[i]  # (B, Hkv, S, D)
            q = qkv_rope(x, b.attn_norm, *_weights(b.wqkv), cos, sin, positions, k_cache, v_cache,
                         eps, cfg.n_heads, cfg.n_kv_heads)  # (B, Hq, D); K and V written at positions
            x = attn_proj_residual(q, k_cache, v_cache, seq_lens, cache.split_arrivals[i], *_weights(b.wo), x,
                                   sm_scale)  # (B, C)
            gw, gs, go, _ = _weights(b.w_gate_up)
            h = norm_swiglu(x, b.ffn_norm, gw, gs, go, eps)  # (B, F)
            x = proj_residual(h, *_weights(b.w_down), x)  # (B, C)
        token, logits = get("fused_head_argmax")(x, w.norm, *_weights(w.lm_head), eps)
        self.last_token = token
        return token, logits

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
        """Decoder.decode's contract: logits (B, V). The greedy token is in ``last_token``."""
        return self.decode_token(tokens, positions, cache)[1]
