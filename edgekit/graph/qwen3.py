"""The Qwen3 family's forward (dense Qwen3): Llama's pre-norm block with per-head RMSNorm of Q and K before RoPE.

head_dim is its own (0.6B: hidden 1024, 16 heads of 128), no QKV bias, SwiGLU MLP, tied LM head.
"""

from __future__ import annotations

from edgekit.graph.builder import GraphBuilder


def qwen3(b: GraphBuilder) -> dict[str, str]:
    cfg = b.cfg
    eps = cfg.rms_norm_eps
    x = b.embed()  # (B, T, C); (B, C) in a decode step
    rope = b.rope_tables("rope", cfg.rope_theta)
    seq_lens = b.seq_lens()

    def block(p: str, x: str) -> str:
        h = b.rmsnorm(x, f"{p}.attn_norm", "attn_norm", eps)
        q, k, v = b.qkv_rope(h, f"{p}.wqkv", rope, "rope", qk_norm=(f"{p}.q_norm", f"{p}.k_norm"), eps=eps)
        o = b.attention(q, k, v, seq_lens, cfg.attention_scale)  # (B, T, Hq D)
        x = b.add(x, b.linear(o, f"{p}.wo", "wo"), "attn_residual")
        h = b.rmsnorm(x, f"{p}.ffn_norm", "ffn_norm", eps)
        return b.add(x, b.gated_mlp(h, p, "swiglu"), "ffn_residual")

    for i in range(cfg.n_layers):
        x = b.block(i, x, block)
    return b.head(x, "norm", eps)
