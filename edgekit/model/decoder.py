"""edgekit's compact Llama-family decoder (Llama, SmolLM2, Qwen2, Mistral).

It reads like the math and owns no kernels: every operator goes through the
dispatch table ``ops``. Shapes are static: a prefill runs on a padded bucket
with per-sequence lengths, a decode step runs one token per sequence against
the preallocated KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgekit.kernels.dispatch import DispatchTable
from edgekit.kernels.linear import LinearWeights
from edgekit.kernels.rope import rope_frequencies
from edgekit.model.config import ModelConfig
from edgekit.model.embedding import QuantizedEmbedding, embedding_nbytes, is_tied, lookup
from edgekit.model.kv_cache import StaticKVCache


@dataclass
class BlockWeights:
    attn_norm: torch.Tensor  # (C,)
    wqkv: LinearWeights  # ((Hq + 2 Hkv) D, C), Q|K|V rows, optional bias
    wo: LinearWeights  # (C, Hq D)
    ffn_norm: torch.Tensor  # (C,)
    w_gate_up: LinearWeights  # (2F, C), gate rows then up rows
    w_down: LinearWeights  # (C, F)

    def linears(self) -> dict[str, LinearWeights]:
        return {"wqkv": self.wqkv, "wo": self.wo, "w_gate_up": self.w_gate_up, "w_down": self.w_down}


@dataclass
class ModelWeights:
    tok_embeddings: torch.Tensor | QuantizedEmbedding  # (V, C); read from lm_head's record when tied and quantized
    blocks: list[BlockWeights]
    norm: torch.Tensor  # (C,)
    lm_head: LinearWeights  # (V, C); shares tok_embeddings when tied

    @property
    def tied(self) -> bool:
        """Whether the embedding lookup and the LM head are one matrix (float, or the head's quantized record)."""
        return is_tied(self.tok_embeddings, self.lm_head)

    def to(self, device=None, dtype=None) -> "ModelWeights":
        def mv(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=dtype if dtype is not None else t.dtype)

        if isinstance(self.tok_embeddings, QuantizedEmbedding):  # tied and quantized: the head moves once
            head = self.lm_head.to(device, dtype)
            emb = QuantizedEmbedding(head, dtype if dtype is not None else self.tok_embeddings.dtype)
        else:
            emb = mv(self.tok_embeddings)
            # a tied LM head stays tied: one tensor, not two copies (and serializers see the tie)
            head = (LinearWeights("linear", emb, mv(self.lm_head.bias) if self.lm_head.bias is not None else None)
                    if self.lm_head.weight is self.tok_embeddings else self.lm_head.to(device, dtype))
        return ModelWeights(
            tok_embeddings=emb,
            blocks=[
                BlockWeights(
                    attn_norm=mv(b.attn_norm), wqkv=b.wqkv.to(device, dtype), wo=b.wo.to(device, dtype),
                    ffn_norm=mv(b.ffn_norm), w_gate_up=b.w_gate_up.to(device, dtype), w_down=b.w_down.to(device, dtype),
                )
                for b in self.blocks
            ],
            norm=mv(self.norm),
            lm_head=head,
        )

    def nbytes(self) -> int:
        n = embedding_nbytes(self.tok_embeddings) + self.norm.numel() * self.norm.element_size()
        for b in self.blocks:
            n += sum(lw.nbytes() for lw in b.linears().values())
            n += (b.attn_norm.numel() + b.ffn_norm.numel()) * b.attn_norm.element_size()
        if isinstance(self.tok_embeddings, QuantizedEmbedding) or self.lm_head.weight.data_ptr() != self.tok_embeddings.data_ptr():
            n += self.lm_head.nbytes()
        return n


class Decoder:
    """Forward passes over static shapes. Not an nn.Module: weights are plain tensors, swapped in as data."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, ops: DispatchTable | None = None):
        self.config = config
        self.weights = weights
        self.ops = ops or DispatchTable()
        self.device = weights.tok_embeddings.device
        self.dtype = weights.tok_embeddings.dtype
        # RoPE tables stay FP32 for every activation dtype (FP64 for an FP64 reference run).
        table_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        cos, sin = rope_frequencies(config.head_dim, config.max_position_len, config.rope_theta, table_dtype)
        self._cos, self._sin = cos.to(self.device), sin.to(self.device)

    def with_ops(self, ops: DispatchTable) -> "Decoder":
        """The same model (weights shared, not copied) calling operators through another table."""
        view = object.__new__(Decoder)
        view.__dict__.update(self.__dict__)
        view.ops = ops
        return view

    def new_cache(self, batch: int, max_seq_len: int) -> StaticKVCache:
        return StaticKVCache(self.config, batch, max_seq_len, self.dtype, self.device)

    def _block(self, b: BlockWeights, x: torch.Tensor, attend) -> torch.Tensor:
        cfg, ops = self.config, self.ops
        h = ops.rmsnorm(x, b.attn_norm, cfg.rms_norm_eps)
        attn = attend(h)  # (B, T, Hq*D)
        x = x + ops.linear(attn, b.wo)
        h = ops.rmsnorm(x, b.ffn_norm, cfg.rms_norm_eps)
        return x + ops.linear(ops.swiglu(ops.linear(h, b.w_gate_up)), b.w_down)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.linear(self.ops.rmsnorm(x, self.weights.norm, self.config.rms_norm_eps), self.weights.lm_head)

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, seq_lens: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
        """tokens (B, T) padded to a bucket, seq_lens (B,) real lengths. Returns logits at each last real token (B, V)."""
        cfg = self.config
        B, T = tokens.shape
        x = lookup(self.weights.tok_embeddings, tokens)  # (B, T, C)
        cos = self._cos[:T][None].expand(B, T, -1)  # (B, T, D/2)
        sin = self._sin[:T][None].expand(B, T, -1)
        for i, b in enumerate(self.weights.blocks):

            def attend(h, i=i, b=b):
                q, k, v = self.ops.qkv_rope(h, b.wqkv, cos, sin, cfg.n_heads, cfg.n_kv_heads)  # (B, H, T, D)
                cache.write_prefix(i, k, v)
                o = self.ops.attention_prefill(q, k, v, seq_lens)  # (B, Hq, T, D)
                return o.transpose(1, 2).reshape(B, T, cfg.q_size)

            x = self._block(b, x, attend)
        last = x[torch.arange(B, device=x.device), seq_lens.to(x.device) - 1]  # (B, C)
        return self._logits(last)

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, cache: StaticKVCache) -> torch.Tensor:
        """tokens (B,) at positions (B,): one step. Returns logits (B, V)."""
        cfg = self.config
        B = tokens.shape[0]
        x = lookup(self.weights.tok_embeddings, tokens)[:, None]  # (B, 1, C)
        cos = self._cos[positions][:, None]  # (B, 1, D/2)
        sin = self._sin[positions][:, None]
        seq_lens = positions + 1
        for i, b in enumerate(self.weights.blocks):

            def attend(h, i=i, b=b):
                q, k, v = self.ops.qkv_rope(h, b.wqkv, cos, sin, cfg.n_heads, cfg.n_kv_heads)  # (B, H, 1, D)
                cache.write_token(i, k, v, positions)
                k_all, v_all = cache.layer(i)  # (B, Hkv, S, D)
                o = self.ops.attention_decode(q[:, :, 0], k_all, v_all, seq_lens)  # (B, Hq, D)
                return o.reshape(B, 1, cfg.q_size)

            x = self._block(b, x, attend)
        return self._logits(x[:, 0])
