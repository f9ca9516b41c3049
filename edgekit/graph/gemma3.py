"""The Gemma 3 family's forward (text): norms before and after attention and MLP, QK-norm, GeGLU, sliding windows.

The embedding is scaled by sqrt(hidden) (rounded to the activation dtype first); every norm is an RMSNorm whose
(1 + w) weight was folded at intake; the query scale comes from query_pre_attn_scalar; 5 of every 6 layers attend
to a sliding window of the last ``sliding_window`` positions (a ring KV cache, their own RoPE base), the 6th to
everything. No logit soft-capping (Gemma 3 has none), tied LM head.
"""

from __future__ import annotations

from edgekit.graph.builder import GraphBuilder

GATED_ACTIVATION = {"silu": "swiglu", "gelu_tanh": "geglu"}  # config.activation -> the gated MLP operator


def gemma3(b: GraphBuilder) -> dict[str, str]:
    cfg = b.cfg
    eps = cfg.rms_norm_eps
    x = b.embed(scale=cfg.embedding_scale)  # (B, T, C); (B, C) in a decode step
    local = any(cfg.is_local(i) for i in range(cfg.n_layers))
    tables = {"rope": b.rope_tables("rope", cfg.rope_theta)}
    if local and cfg.rope_local_theta is not None:
        tables["rope_local"] = b.rope_tables("rope_local", cfg.rope_local_theta)
    full = {"seq_lens": b.seq_lens(), "slots": "@positions"}  # what a global layer attends with
    ring = b.window_state(cfg.sliding_window) if local else full  # what a local (sliding-window) layer attends with
    act = GATED_ACTIVATION[cfg.activation]

    def block(p: str, x: str) -> str:
        window = cfg.window(b.layer)  # 0: a global layer
        rope = "rope_local" if window and "rope_local" in tables else "rope"
        at = ring if window else full
        h = b.rmsnorm(x, f"{p}.attn_norm", "attn_norm", eps)
        q, k, v = b.qkv_rope(h, f"{p}.wqkv", tables[rope], rope, qk_norm=(f"{p}.q_norm", f"{p}.k_norm"), eps=eps)
        o = b.attention(q, k, v, at["seq_lens"], cfg.attention_scale, window, at["slots"])  # (B, T, Hq D)
        o = b.rmsnorm(b.linear(o, f"{p}.wo", "wo"), f"{p}.post_attn_norm", "post_attn_norm", eps)
        x = b.add(x, o, "attn_residual")
        h = b.rmsnorm(x, f"{p}.ffn_norm", "ffn_norm", eps)
        y = b.rmsnorm(b.gated_mlp(h, p, act), f"{p}.post_ffn_norm", "post_ffn_norm", eps)
        return b.add(x, y, "ffn_residual")

    for i in range(cfg.n_layers):
        x = b.block(i, x, block)
    return b.head(x, "norm", eps)
