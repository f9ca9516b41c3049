"""The Qwen3 / Gemma 3 fused decode operators' patterns, proven on the families' own decode graphs.

The Qwen3 and Gemma 3 graphs (graph/qwen3.py, graph/gemma3.py: a QK-norm block rmsnorm -> as_tokens -> linear ->
qk_norm_rope -> kv_store {k, v, slots} -> select_token -> attention_decode -> merge_heads -> linear; Gemma's
post-norms before each residual add and GeGLU), rewritten by the fused path's fusions, become the fused operators,
and on the CPU (every operator its torch reference) the rewritten graph answers what the graph as written does, step
after step, through a sliding-window layer's ring (its kv_slots / window_lens glue: position % window, lengths
clamped to the window) and a global layer.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from edgekit.graph.builder import GraphBuilder, LinearSchemes
from edgekit.graph.executor import ExecContext, run_graph
from edgekit.graph.families import graph_for
from edgekit.graph.node import DECODE
from edgekit.graph.paths import FUSED, PER_OPERATOR
from edgekit.graph.rewrite import fusions_of, rewrite
from edgekit.kernels.attention import default_scale
from edgekit.kernels.dispatch import DispatchTable
from edgekit.kernels.linear import LinearWeights
from edgekit.kernels.rope import rope_frequencies
from edgekit.model.config import ModelConfig
from edgekit.model.kv_cache import StaticKVCache
from edgekit.model.presets import preset_config

WINDOW = 4  # the local layer's ring
GLOBAL_ROWS = 16


def _config(family="qwen3", n_layers=2, C=64, F=96, Hq=4, Hkv=2, D=32, vocab=80) -> ModelConfig:
    """head_dim decoupled from hidden / heads (Hq D = 128 != C = 64), as Qwen3's. Gemma 3: layer 0 local (RoPE base
    10000, a ring of WINDOW rows), layer 1 global, a query scale that is not 1 / sqrt(D)."""
    cfg = ModelConfig(family, vocab, C, F, n_layers, Hq, Hkv, D, 64, rope_theta=1e6, rms_norm_eps=1e-6,
                      tie_embeddings=True, qk_norm=True)
    if family == "gemma3":
        cfg = dataclasses.replace(cfg, activation="gelu_tanh", post_norms=True, embedding_scale=math.sqrt(C),
                                  query_scale=0.8 * default_scale(D), sliding_window=WINDOW, sliding_window_pattern=2,
                                  rope_local_theta=1e4)
    return cfg


def _graphs(cfg, schemes=None):
    """(the family's decode graph as written, the fused path's rewrite of it)."""
    graph = graph_for(cfg, schemes or LinearSchemes.uniform(cfg.n_layers), DECODE)
    return graph, rewrite(graph, fusions_of(FUSED) + fusions_of(PER_OPERATOR), FUSED)


def _producers(graph) -> dict[str, str]:
    """value name -> the op of the node that makes it."""
    return {v: n.op for n in graph.nodes for v in n.outputs.values()}


def _weights(cfg, dtype, int4: bool = False, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    C, F, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim

    def norm(n):
        return (1 + 0.2 * torch.randn(n, generator=g)).to(dtype)

    def proj(n, k):
        w = torch.randn(n, k, generator=g) / k ** 0.5
        if not int4:
            return LinearWeights("linear", w.to(dtype))
        from edgekit.kernels.int4_layout import quantize_int4_rtn

        q, s, m = quantize_int4_rtn(w, 32, symmetric=False, scale_dtype=torch.float16)
        return LinearWeights("linear_w4a16", q, None, s, offset=m)

    blocks = [SimpleNamespace(attn_norm=norm(C), wqkv=proj((cfg.n_heads + 2 * cfg.n_kv_heads) * D, C), q_norm=norm(D),
                              k_norm=norm(D), wo=proj(C, cfg.q_size), post_attn_norm=norm(C), ffn_norm=norm(C),
                              w_gate_up=proj(2 * F, C), w_down=proj(C, F), post_ffn_norm=norm(C))
              for _ in range(cfg.n_layers)]
    emb = torch.randn(cfg.vocab_size, C, generator=g).to(dtype)
    return SimpleNamespace(tok_embeddings=emb, blocks=blocks, norm=norm(C), lm_head=LinearWeights("linear", emb))


def _decode_both(cfg, dtype, int4=False, steps=9):
    """Logits of each step of the graph as written and of its fused rewrite, two sequences at their own positions
    (the second starts 3 ahead), each graph on its own cache; and the caches after the last step."""
    schemes = LinearSchemes.uniform(cfg.n_layers, "w4a16" if int4 else "fp16")
    graph, fused = _graphs(cfg, schemes)
    weights = _weights(cfg, dtype, int4)
    table_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    tables = {name: rope_frequencies(cfg.head_dim, 64, theta, table_dtype)
              for name, theta in (("rope", 1e6), ("rope_local", 1e4))}
    caches = {g: StaticKVCache(cfg, 2, GLOBAL_ROWS, dtype) for g in ("written", "fused")}
    logits = {"written": [], "fused": []}
    for t in range(steps):
        state = {"@tokens": torch.tensor([(5 * t) % cfg.vocab_size, (7 * t + 1) % cfg.vocab_size]),
                 "@positions": torch.tensor([t, t + 3])}
        for key, g in (("written", graph), ("fused", fused.graph)):
            ctx = ExecContext(DECODE, DispatchTable(), weights, lambda n: tables[n], caches[key], dict(state))
            logits[key].append(run_graph(g, ctx)[g.outputs["logits"]])
    return fused, logits, caches


def _layer_ops(graph, layer):
    return [n.op for n in graph.layer_nodes(layer)]


def test_a_qwen3_decode_graph_fuses_into_the_llama_paths_operators_plus_the_qk_norm_qkv():
    cfg = _config()
    _, r = _graphs(cfg)
    for i in range(cfg.n_layers):
        assert _layer_ops(r.graph, i) == ["fused_norm_qkv_qknorm_rope", "fused_attn_proj_residual",
                                          "fused_norm_swiglu", "fused_proj_residual"]
    assert [n.op for n in r.graph.nodes if n.layer is None] == ["embed", "seq_lens", "fused_head_argmax"]
    qkv = r.graph.layer_nodes(0)[0]
    assert qkv.inputs["slots"] == "@positions" and qkv.attrs["rope"] == "rope"
    assert qkv.weights == {"norm_weight": "blocks.0.attn_norm", "proj": "blocks.0.wqkv", "q_norm": "blocks.0.q_norm",
                           "k_norm": "blocks.0.k_norm"}
    assert r.subsumed() >= {"rmsnorm", "qk_norm_rope", "attention_decode", "swiglu"}


def test_a_gemma3_decode_graph_fuses_its_post_norms_geglu_and_the_attention_without_residual():
    cfg = _config("gemma3")
    _, r = _graphs(cfg)
    for i in range(cfg.n_layers):
        assert _layer_ops(r.graph, i) == ["fused_norm_qkv_qknorm_rope", "fused_attn_proj", "norm_residual",
                                          "fused_norm_geglu", "linear", "norm_residual"]
    made_by = _producers(r.graph)
    local, glob = r.graph.layer_nodes(0)[0], r.graph.layer_nodes(1)[0]
    assert (made_by[local.inputs["slots"]], local.attrs["rope"]) == ("kv_slots", "rope_local")
    assert (glob.inputs["slots"], glob.attrs["rope"]) == ("@positions", "rope")
    assert made_by[r.graph.layer_nodes(0)[1].inputs["seq_lens"]] == "window_lens"
    assert made_by[r.graph.layer_nodes(1)[1].inputs["seq_lens"]] == "seq_lens"
    assert r.graph.layer_nodes(0)[1].attrs["sm_scale"] == pytest.approx(0.8 * default_scale(cfg.head_dim))
    # both RoPE tables' row gathers served only the unfused QK-norm: dropped with it
    assert [n.op for n in r.graph.nodes if n.layer is None] == ["embed", "seq_lens", "kv_slots", "window_lens",
                                                                "fused_head_argmax"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_the_fused_rewrite_decodes_what_the_graph_as_written_decodes(family, dtype):
    """Nine steps through a 4-row ring (positions 0-11: the ring wraps twice) and a global layer: every step's
    logits and, after the last, every cache row the same."""
    cfg = _config(family)
    fused, logits, caches = _decode_both(cfg, dtype)
    tol = {torch.float64: 1e-12, torch.float32: 2e-6}[dtype]
    for step, (want, got) in enumerate(zip(logits["written"], logits["fused"])):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=f"step {step}")
    for layer in range(cfg.n_layers):
        torch.testing.assert_close(caches["fused"].k[layer], caches["written"].k[layer], rtol=tol, atol=tol)
        torch.testing.assert_close(caches["fused"].v[layer], caches["written"].v[layer], rtol=tol, atol=tol)
    assert fused.fused["fused_norm_qkv_qknorm_rope"] == cfg.n_layers
    if family == "gemma3":
        assert caches["written"].k[0].shape[2] == WINDOW  # the local layer's cache is the ring the steps wrapped


def test_an_int4_gemma3_graph_fuses_every_projection_and_decodes_what_it_did_unfused():
    cfg = _config("gemma3")
    fused, logits, _ = _decode_both(cfg, torch.float32, int4=True, steps=6)
    assert fused.fused["fused_attn_proj"] == fused.fused["fused_norm_geglu"] == cfg.n_layers
    for want, got in zip(logits["written"], logits["fused"]):
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)


def test_a_post_norm_added_as_the_adds_first_operand_stays_unfused_and_says_why():
    """norm_residual binds the add's ``a`` as the residual; an add whose ``a`` is the norm's output (the stream as
    ``b``) would leave the fused node reading a value the rewrite removed, so the run stays as written."""
    cfg = _config(n_layers=1)
    b = GraphBuilder(cfg, LinearSchemes.uniform(1), DECODE, "test")
    x = b.embed()

    def block(p, x):
        normed = b.rmsnorm(x, f"{p}.post_attn_norm", "post_norm", 1e-6)
        return b.node("add", "post_residual", {"a": normed, "b": x})["y"]

    g = b.build({"hidden": b.block(0, x, block)})
    r = rewrite(g, fusions_of(FUSED), FUSED)
    assert "norm_residual" not in r.fused and [n.op for n in r.graph.nodes] == ["embed", "rmsnorm", "add"]
    assert "made inside the run" in r.unmatched["norm_residual"]


def _two_layers(preset: str) -> ModelConfig:
    """A preset's real shapes, 2 of its layers (Gemma 3: a local and a global one)."""
    cfg = dataclasses.replace(preset_config(preset), n_layers=2)
    return dataclasses.replace(cfg, sliding_window_pattern=2) if cfg.sliding_window else cfg


@pytest.mark.parametrize("scheme", ["fp16", "w8a16", "w4a16"])
@pytest.mark.parametrize("model", ["qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "gemma-3-1b"])
def test_predicted_kernels_a_layer_of_the_fused_qwen3_and_gemma3_steps(model, scheme):
    """Kernels a decode layer launches on the fused path, counted from the operators' launch programs at the default
    tiles (predicted, not measured): Qwen3 as the Llama family's 5; Gemma 3 its fused operators' 6 plus the MLP down
    projection's own linear (a norm sits between it and the residual add), on the Orin's 16 SMs and the H200's 132."""
    from edgekit.graph.launch_count import count_launches
    from edgekit.model.weights import empty_weights

    cfg = _two_layers(model)
    schemes = LinearSchemes.uniform(cfg.n_layers, scheme)
    _, r = _graphs(cfg, schemes)
    cache = StaticKVCache(cfg, 1, 512, torch.float16, "meta")
    for sms in (16, 132):
        c = count_launches(r.graph, empty_weights(cfg, schemes), cache, batch=1, tokens=1, sm_count=sms,
                           max_shared_bytes=166912)
        ops = c["operators"]
        if cfg.architecture == "qwen3":
            assert c["per_layer"] == 5, c
            assert c["outside_layers"] == 4  # embedding gather, lengths, fused head GEMV + argmax reduce
        else:
            down = ops[{"fp16": "linear", "w8a16": "linear_w8a16", "w4a16": "linear_w4a16"}[scheme]] // cfg.n_layers
            assert down in (1, 2) and c["per_layer"] == 6 + down, c
            # and the embedding's sqrt(hidden) scale (1), the local layers' ring slots (1) and clamped lengths (2)
            assert c["outside_layers"] == 8
        print(f"PREDICTED {model} {scheme} sm={sms}: {c['per_layer']} kernels a layer, {c['outside_layers']} outside")


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_the_attention_reads_sequence_lengths_made_before_the_qkv_operator(family):
    """The attention prefetches its keys and values before its PDL wait, from the sequence lengths (pdl_launch.py:
    the QKV operator lets it launch at its start); that read is safe only while the lengths come from a node that
    runs before the layer's QKV operator, never from one between it and the attention."""
    from edgekit.kernels.pdl_launch import AFTER_ATTENTION_OPS, QKV_OPS

    _, fused = _graphs(_config(family))
    nodes = list(fused.graph.nodes)
    made_at = {v: i for i, n in enumerate(nodes) for v in n.outputs.values()}
    attentions = [i for i, n in enumerate(nodes) if AFTER_ATTENTION_OPS.get(n.op) == 2]
    assert len(attentions) == 2  # one a layer
    for i in attentions:
        qkv = max(j for j in range(i) if nodes[j].op in QKV_OPS)
        assert qkv == i - 1, f"{nodes[i].name}: launched right after its QKV operator"
        assert made_at[nodes[i].inputs["seq_lens"]] < qkv, f"{nodes[i].name}'s sequence lengths are made after the QKV"


def _tied_quantized_head(weights, scheme: str, dtype):
    """``weights`` with its tied head quantized (INT8 channel scales, or INT4 with offsets or symmetric) and the table
    read from it row by row, as a build stores a tied quantized head."""
    from edgekit.kernels.int4_layout import quantize_int4_rtn
    from edgekit.model.embedding import QuantizedEmbedding
    from edgekit.quant.weights import quantize_per_channel

    w = weights.lm_head.weight.float()
    if scheme == "w8a16":
        q, s = quantize_per_channel(w)
        head = LinearWeights("linear_w8a16", q, None, s)
    else:
        q, s, m = quantize_int4_rtn(w, 32, symmetric=scheme == "w4a16-sym", scale_dtype=torch.float16)
        head = LinearWeights("linear_w4a16", q, None, s, offset=m)
    return SimpleNamespace(**{**vars(weights), "lm_head": head, "tok_embeddings": QuantizedEmbedding(head, dtype)})


@pytest.mark.parametrize("scheme", ["w4a16", "w4a16-sym", "w8a16"])
@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_a_tied_quantized_table_is_looked_up_by_one_operator_on_the_fused_path(family, scheme):
    """The embed glue of a table read from a tied INT8 / INT4 head becomes fused_tied_lookup on the fused path only
    (the per-operator path, the prefill and a float table keep the glue), with Gemma's embedding scale and the run's
    activation dtype bound; every step's logits equal the unfused graph's bit for bit (the operator's reference is the
    glue's computation)."""
    cfg = _config(family)
    dtype = torch.float32
    weights = _tied_quantized_head(_weights(cfg, dtype), scheme, dtype)
    schemes = LinearSchemes.of_weights(weights)
    assert schemes.embedding == schemes.lm_head == scheme.removesuffix("-sym")
    graph, fused = _graphs(cfg, schemes)
    lookup = fused.graph.nodes[0]
    assert lookup.op == "fused_tied_lookup" and fused.fused["fused_tied_lookup"] == 1
    assert dict(lookup.attrs) == {"dtype": "@act_dtype", "row_scale": cfg.embedding_scale}
    assert lookup.weights == {"proj": "lm_head"} and lookup.inputs == {"tokens": "@tokens"}
    assert graph.nodes[0].op == "embed"
    assert _graphs(cfg, dataclasses.replace(schemes, embedding="fp16"))[1].graph.nodes[0].op == "embed"
    tables = {name: rope_frequencies(cfg.head_dim, 64, theta, torch.float32) for name, theta in (("rope", 1e6),
                                                                                                 ("rope_local", 1e4))}
    caches = {g: StaticKVCache(cfg, 2, GLOBAL_ROWS, dtype) for g in ("written", "fused")}
    for t in range(4):
        state = {"@tokens": torch.tensor([(5 * t) % cfg.vocab_size, cfg.vocab_size - 1]),
                 "@positions": torch.tensor([t, t + 3])}
        out = {}
        for key, g in (("written", graph), ("fused", fused.graph)):
            ctx = ExecContext(DECODE, DispatchTable(), weights, lambda n: tables[n], caches[key], dict(state))
            out[key] = run_graph(g, ctx)[g.outputs["logits"]]
        assert torch.equal(out["fused"], out["written"]), f"step {t}"
