"""Qwen3's graph: Llama's block with a qk_norm_rope node after the QKV projection; the Llama family's graph keeps its
nodes (a decode step's cache row is its position)."""

from __future__ import annotations

import pytest

from edgekit.graph.builder import LinearSchemes
from edgekit.graph.families import family_of, graph_for
from edgekit.graph.node import DECODE, PREFILL
from edgekit.model.presets import preset_config


def test_the_qkv_projection_feeds_qk_norm_rope_with_the_blocks_norms():
    cfg = preset_config("tiny-qwen3")  # head_dim 32 with hidden 64 and 4 heads
    g = graph_for(cfg, LinearSchemes.uniform(cfg.n_layers), PREFILL)
    assert family_of("qwen3") == "qwen3" and "rope" not in g.operators()
    node = next(n for n in g.layer_nodes(1) if n.op == "qk_norm_rope")
    assert dict(node.weights) == {"q_norm": "blocks.1.q_norm", "k_norm": "blocks.1.k_norm"}
    assert dict(node.attrs) == {"n_heads": 4, "n_kv_heads": 2, "eps": 1e-6, "rope": "rope"}
    attn = next(n for n in g.layer_nodes(1) if n.op == "attention_prefill")
    assert attn.attrs["scale"] == pytest.approx(32 ** -0.5) and attn.attrs["window"] == 0


def test_llama_family_decode_writes_each_token_at_its_position():
    cfg = preset_config("smollm2-135m")
    g = graph_for(cfg, LinearSchemes.uniform(cfg.n_layers), DECODE)
    stores = [n for n in g.nodes if n.op == "kv_store"]
    assert len(stores) == cfg.n_layers and all(dict(n.inputs)["slots"] == "@positions" for n in stores)
    assert not {"kv_slots", "window_lens", "qk_norm_rope", "geglu"} & set(g.operators())
