"""The Llama family's forward (Llama, SmolLM2, Mistral, Qwen2): pre-norm blocks, GQA, RoPE, SwiGLU."""

from __future__ import annotations

from edgekit.graph.builder import GraphBuilder
from edgekit.kernels.attention import default_scale


def llama(b: GraphBuilder) -> dict[str, str]:
    cfg = b.cfg
    eps = cfg.rms_norm_eps
    x = b.embed()  # (B, T, C); (B, C) in a decode step
    rope = b.rope_tables("rope", cfg.rope_theta)
    seq_lens = b.seq_lens()

    def block(p: str, x: str) -> str:
        h = b.rmsnorm(x, f"{p}.attn_norm", "attn_norm", eps)
        q, k, v = b.qkv_rope(h, f"{p}.wqkv", rope, "rope")  # (B, H, T, D)
        o = b.attention(q, k, v, seq_lens, default_scale(cfg.head_dim))  # (B, T, Hq D)
        x = b.add(x, b.linear(o, f"{p}.wo", "wo"), "attn_residual")
        h = b.rmsnorm(x, f"{p}.ffn_norm", "ffn_norm", eps)
        return b.add(x, b.gated_mlp(h, p, "swiglu"), "ffn_residual")

    for i in range(cfg.n_layers):
        x = b.block(i, x, block)
    return b.head(x, "norm", eps)
