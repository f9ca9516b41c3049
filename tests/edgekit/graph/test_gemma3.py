"""Gemma 3's graph: what the family function declares for local and global layers, the ring state a decode step
computes once, and the node runs the fused decode operators' patterns match (kernels/fusion.py)."""

from __future__ import annotations

import pytest

from edgekit.graph.builder import LinearSchemes
from edgekit.graph.families import family_of, graph_for
from edgekit.graph.node import DECODE, PREFILL
from edgekit.model.presets import preset_config

CFG = preset_config("tiny-gemma3")  # layers 0, 1 local (window 4), layer 2 global


def _graph(phase):
    return graph_for(CFG, LinearSchemes.uniform(CFG.n_layers), phase)


def _node(g, layer, op, nth=0):
    return [n for n in g.layer_nodes(layer) if n.op == op][nth]


def test_local_layers_attend_to_a_window_with_their_own_rope_and_global_layers_to_everything():
    g = _graph(PREFILL)
    assert family_of("gemma3") == "gemma3" and dict(g.rope) == {"rope": 1e6, "rope_local": 1e4}
    for layer, window, rope in ((0, 4, "rope_local"), (1, 4, "rope_local"), (2, 0, "rope")):
        assert _node(g, layer, "attention_prefill").attrs["window"] == window
        assert _node(g, layer, "attention_prefill").attrs["scale"] == pytest.approx(24 ** -0.5)
        assert _node(g, layer, "qk_norm_rope").attrs["rope"] == rope
        # a local layer's prefill passes the sequence lengths to its ring (a long chunk keeps each one's last rows)
        assert ("seq_lens" in _node(g, layer, "kv_store").inputs) == bool(window)
    assert g.nodes[0].op == "embed" and g.nodes[0].attrs["scale"] == 8.0


def test_a_decode_step_computes_the_ring_rows_once_and_local_layers_read_them():
    g = _graph(DECODE)
    outside = [n for n in g.nodes if n.layer is None]
    slots = [n for n in outside if n.op == "kv_slots"]
    lens = [n for n in outside if n.op == "window_lens"]
    assert len(slots) == len(lens) == 1 and slots[0].attrs["window"] == lens[0].attrs["window"] == 4
    position_lens = next(n for n in outside if n.op == "seq_lens").outputs["seq_lens"]
    for layer, local in ((0, True), (1, True), (2, False)):
        store, attn = _node(g, layer, "kv_store"), _node(g, layer, "attention_decode")
        assert store.inputs["slots"] == (slots[0].outputs["slots"] if local else "@positions")
        assert attn.inputs["seq_lens"] == (lens[0].outputs["seq_lens"] if local else position_lens)


def test_each_branch_is_normed_before_its_residual_add():
    g = _graph(DECODE)
    for layer in range(CFG.n_layers):
        nodes = list(g.layer_nodes(layer))
        for add in (n for n in nodes if n.op == "add"):
            before = nodes[nodes.index(add) - 1]
            assert before.op == "rmsnorm" and add.inputs["b"] == before.outputs["y"]
            assert before.weights["weight"].split(".")[-1] in ("post_attn_norm", "post_ffn_norm")


@pytest.mark.parametrize("pattern", [
    ("rmsnorm", "as_tokens", "linear", "qk_norm_rope", "kv_store", "select_token"),  # fused_norm_qkv_qknorm_rope
    ("rmsnorm", "linear", "geglu"),  # fused_norm_geglu
    ("attention_decode", "merge_heads", "linear"),  # fused_attn_proj (no residual add: a norm comes first)
    ("rmsnorm", "add"),  # norm_residual: residual + rmsnorm(branch)
])
def test_every_decode_layer_holds_the_runs_the_fused_operators_replace(pattern):
    g = _graph(DECODE)
    for layer in range(CFG.n_layers):
        ops = [n.op if not n.op.startswith("linear") else "linear" for n in g.layer_nodes(layer)]
        assert any(tuple(ops[i:i + len(pattern)]) == pattern for i in range(len(ops))), (layer, ops)
