"""The Qwen3 / Gemma 3 fused decode operators' patterns, proven on hand-built decode graphs before the families land.

The graphs follow the node sequence of the issue-30 design (a QK-norm block: rmsnorm -> as_tokens -> linear ->
qk_norm_rope -> kv_store {k, v, slots} -> select_token -> attention_decode -> merge_heads -> linear; Gemma's
post-norms before each residual add and GeGLU): rewritten by the fused path's fusions they become the fused
operators, and on the CPU (every operator its torch reference) the rewritten graph answers what the graph as written
does, step after step, through a sliding-window layer's ring (slots = position % window, lengths clamped to the
window) and a global layer. Where the families' operators (``qk_norm_rope``, ``geglu``) are not registered yet, the
test files stand-ins with the shared formulas (kernels/family_math.py); once they are, it runs theirs.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from edgekit.graph.builder import GraphBuilder, LinearSchemes
from edgekit.graph.executor import ExecContext, run_graph
from edgekit.graph.node import DECODE
from edgekit.graph.paths import FUSED, PER_OPERATOR
from edgekit.graph.rewrite import fusions_of, rewrite
from edgekit.kernels.attention import default_scale
from edgekit.kernels.dispatch import DispatchTable
from edgekit.kernels.family_math import geglu_math, qk_norm_rope_math
from edgekit.kernels.linear import LinearWeights, empty_linear
from edgekit.kernels.operator import OpPrecision, Operator
from edgekit.kernels.registry import OPERATORS
from edgekit.kernels.rope import rope_frequencies
from edgekit.kernels.spec import ELEMENTWISE_TOLERANCE, FLOAT_DTYPES, REDUCTION_TOLERANCE, OpSpec, TensorSpec
from edgekit.model.config import ModelConfig

WINDOW = 4  # the local layer's ring
GLOBAL_ROWS = 16
# what the families' glue computes for a local layer: position % W, min(position + 1, W)
LOCAL_SLOTS, LOCAL_LENS = "@local_slots", "@local_lens"


@pytest.fixture
def family_operators(monkeypatch):
    """The families' operators: theirs where registered, else test stand-ins computing the shared formulas."""
    def stand_in(name, inputs, outputs, attributes, fn, tolerance):
        spec = OpSpec(name, 1, inputs, outputs, attributes, tolerance)
        return Operator(spec, fn, OpPrecision(name, "none", "fp16", "fp32", "fp16"), lambda *a: ({}, {}))

    t = lambda name, shape: TensorSpec(name, shape, FLOAT_DTYPES)  # noqa: E731
    if "qk_norm_rope" not in OPERATORS:
        monkeypatch.setitem(OPERATORS, "qk_norm_rope", stand_in(
            "qk_norm_rope", (t("qkv", "(B, T, W)"), t("q_norm", "(D,)"), t("k_norm", "(D,)"), t("cos", "(B, T, D/2)"),
                             t("sin", "(B, T, D/2)")),
            (t("q", "(B, Hq, T, D)"), t("k", "(B, Hkv, T, D)"), t("v", "(B, Hkv, T, D)")),
            ("n_heads", "n_kv_heads", "eps"),
            lambda qkv, qn, kn, c, s, hq, hkv, eps: qk_norm_rope_math(qkv, qn, kn, c, s, hq, hkv, eps),
            REDUCTION_TOLERANCE))
    if "geglu" not in OPERATORS:
        monkeypatch.setitem(OPERATORS, "geglu", stand_in(
            "geglu", (t("gate_up", "(..., 2F)"),), (t("y", "(..., F)"),), (), geglu_math, ELEMENTWISE_TOLERANCE))


def _config(n_layers=2, C=64, F=96, Hq=4, Hkv=2, D=32, vocab=80) -> ModelConfig:
    # head_dim decoupled from hidden / heads (Hq D = 128 != C = 64), as Qwen3's
    return ModelConfig("llama", vocab, C, F, n_layers, Hq, Hkv, D, 64, rms_norm_eps=1e-6, tie_embeddings=True)


def _qk_attention(b: GraphBuilder, p: str, h: str, tables, rope: str, slots: str, lens: str, scale: float) -> str:
    cfg = b.cfg
    h = b.node("as_tokens", "qkv_in", {"x": h})["y"]
    qkv = b.linear(h, f"{p}.wqkv", "wqkv")
    out = b.node("qk_norm_rope", "qk_norm_rope", {"qkv": qkv, "cos": tables["cos"], "sin": tables["sin"]},
                 ("q", "k", "v"), weights={"q_norm": f"{p}.q_norm", "k_norm": f"{p}.k_norm"}, n_heads=cfg.n_heads,
                 n_kv_heads=cfg.n_kv_heads, eps=cfg.rms_norm_eps, rope=rope)
    b.node("kv_store", "kv_store", {"k": out["k"], "v": out["v"], "slots": slots}, ())
    q = b.node("select_token", "q_token", {"x": out["q"]})["y"]
    o = b.node("attention_decode", "attention", {"q": q, "k_cache": "@k_read", "v_cache": "@v_read", "seq_lens": lens},
               ("o",), scale=scale)["o"]
    return b.node("merge_heads", "merge_heads", {"x": o})["y"]


def qwen3_like(b: GraphBuilder) -> dict:
    cfg, eps = b.cfg, b.cfg.rms_norm_eps
    x = b.embed()
    rope = b.rope_tables("rope", 1e6)
    lens = b.seq_lens()

    def block(p, x):
        o = _qk_attention(b, p, b.rmsnorm(x, f"{p}.attn_norm", "attn_norm", eps), rope, "rope", "@positions", lens,
                          default_scale(cfg.head_dim))
        x = b.add(x, b.linear(o, f"{p}.wo", "wo"), "attn_residual")
        act = b.op("swiglu", "swiglu", gate_up=b.linear(b.rmsnorm(x, f"{p}.ffn_norm", "ffn_norm", eps),
                                                        f"{p}.w_gate_up", "w_gate_up"))
        return b.add(x, b.linear(act, f"{p}.w_down", "w_down"), "ffn_residual")

    for i in range(cfg.n_layers):
        x = b.block(i, x, block)
    return b.head(x, "norm", eps)


def gemma_like(b: GraphBuilder, ring: bool = True) -> dict:
    """Gemma 3's block; even layers local (RoPE base 10000, a ring of WINDOW rows), odd layers global. ``ring``
    False binds the local layers like the global ones (the launch count's meta run has no ring state)."""
    cfg, eps = b.cfg, b.cfg.rms_norm_eps
    x = b.embed(scale=math.sqrt(cfg.hidden_size))
    rope, local = b.rope_tables("rope", 1e6), b.rope_tables("rope_local", 1e4)
    lens = b.seq_lens()
    scale = 0.8 * default_scale(cfg.head_dim)  # query_pre_attn_scalar ** -0.5, not 1 / sqrt(D)

    def block(p, x):
        is_local = b.layer % 2 == 0
        tables, name = (local, "rope_local") if is_local else (rope, "rope")
        slots, attended = (LOCAL_SLOTS, LOCAL_LENS) if is_local and ring else ("@positions", lens)
        o = _qk_attention(b, p, b.rmsnorm(x, f"{p}.attn_norm", "attn_norm", eps), tables, name, slots, attended, scale)
        x = b.add(x, b.rmsnorm(b.linear(o, f"{p}.wo", "wo"), f"{p}.post_attn_norm", "post_attn_norm", eps),
                  "attn_residual")
        act = b.op("geglu", "geglu", gate_up=b.linear(b.rmsnorm(x, f"{p}.ffn_norm", "ffn_norm", eps),
                                                      f"{p}.w_gate_up", "w_gate_up"))
        return b.add(x, b.rmsnorm(b.linear(act, f"{p}.w_down", "w_down"), f"{p}.post_ffn_norm", "post_ffn_norm", eps),
                     "ffn_residual")

    for i in range(cfg.n_layers):
        x = b.block(i, x, block)
    return b.head(x, "norm", eps)


def _graphs(cfg, family, schemes=None):
    """(the decode graph as written, the fused path's rewrite of it)."""
    b = GraphBuilder(cfg, schemes or LinearSchemes.uniform(cfg.n_layers), DECODE, "test")
    graph = b.build(family(b))
    return graph, rewrite(graph, fusions_of(FUSED) + fusions_of(PER_OPERATOR), FUSED)


class RingCache:
    """Per-layer K/V tensors of their own length (a local layer's ring of WINDOW rows), written where the step says
    (a row index past the ring wraps), and the per-layer split-KV counters."""

    def __init__(self, cfg, rows: list[int], batch: int, dtype, device="cpu"):
        shape = lambda r: (batch, cfg.n_kv_heads, r, cfg.head_dim)  # noqa: E731
        self.k = [torch.zeros(shape(r), dtype=dtype, device=device) for r in rows]
        self.v = [torch.zeros(shape(r), dtype=dtype, device=device) for r in rows]
        self.split_arrivals = [torch.zeros(batch, cfg.n_kv_heads, dtype=torch.int32, device=device) for _ in rows]
        self.batch, self.max_seq_len = batch, max(rows)

    def write_token(self, layer, k, v, rows_at):
        at, b = rows_at % self.k[layer].shape[2], torch.arange(self.batch)
        self.k[layer][b, :, at] = k[:, :, 0]
        self.v[layer][b, :, at] = v[:, :, 0]

    def layer(self, layer):
        return self.k[layer], self.v[layer]


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


def _decode_both(cfg, family, dtype, int4=False, steps=9):
    """Logits of each step of the graph as written and of its fused rewrite, two sequences at their own positions
    (the second starts 3 ahead), each graph on its own cache; and the caches after the last step."""
    schemes = LinearSchemes.uniform(cfg.n_layers, "w4a16" if int4 else "fp16")
    graph, fused = _graphs(cfg, family, schemes)
    weights = _weights(cfg, dtype, int4)
    table_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    tables = {name: rope_frequencies(cfg.head_dim, 64, theta, table_dtype)
              for name, theta in (("rope", 1e6), ("rope_local", 1e4))}
    rows = [WINDOW if i % 2 == 0 and family is gemma_like else GLOBAL_ROWS for i in range(cfg.n_layers)]
    caches = {g: RingCache(cfg, rows, 2, dtype) for g in ("written", "fused")}
    logits = {"written": [], "fused": []}
    for t in range(steps):
        positions = torch.tensor([t, t + 3])
        state = {"@tokens": torch.tensor([(5 * t) % cfg.vocab_size, (7 * t + 1) % cfg.vocab_size]),
                 "@positions": positions, LOCAL_SLOTS: positions % WINDOW,
                 LOCAL_LENS: torch.clamp(positions + 1, max=WINDOW).to(torch.int32)}
        for key, g in (("written", graph), ("fused", fused.graph)):
            ctx = ExecContext(DECODE, DispatchTable(), weights, lambda n: tables[n], caches[key], dict(state))
            logits[key].append(run_graph(g, ctx)[g.outputs["logits"]])
    return fused, logits, caches


def _layer_ops(graph, layer):
    return [n.op for n in graph.layer_nodes(layer)]


def test_a_qwen3_decode_graph_fuses_into_the_llama_paths_operators_plus_the_qk_norm_qkv(family_operators):
    cfg = _config()
    _, r = _graphs(cfg, qwen3_like)
    for i in range(cfg.n_layers):
        assert _layer_ops(r.graph, i) == ["fused_norm_qkv_qknorm_rope", "fused_attn_proj_residual",
                                          "fused_norm_swiglu", "fused_proj_residual"]
    assert [n.op for n in r.graph.nodes if n.layer is None] == ["embed", "seq_lens", "fused_head_argmax"]
    qkv = r.graph.layer_nodes(0)[0]
    assert qkv.inputs["slots"] == "@positions" and qkv.attrs["rope"] == "rope"
    assert qkv.weights == {"norm_weight": "blocks.0.attn_norm", "proj": "blocks.0.wqkv", "q_norm": "blocks.0.q_norm",
                           "k_norm": "blocks.0.k_norm"}
    assert r.subsumed() >= {"rmsnorm", "qk_norm_rope", "attention_decode", "swiglu"}


def test_a_gemma3_decode_graph_fuses_its_post_norms_geglu_and_the_attention_without_residual(family_operators):
    cfg = _config()
    _, r = _graphs(cfg, gemma_like)
    for i in range(cfg.n_layers):
        assert _layer_ops(r.graph, i) == ["fused_norm_qkv_qknorm_rope", "fused_attn_proj", "norm_residual",
                                          "fused_norm_geglu", "linear", "norm_residual"]
    local, glob = r.graph.layer_nodes(0)[0], r.graph.layer_nodes(1)[0]
    assert (local.inputs["slots"], local.attrs["rope"]) == (LOCAL_SLOTS, "rope_local")
    assert (glob.inputs["slots"], glob.attrs["rope"]) == ("@positions", "rope")
    assert r.graph.layer_nodes(0)[1].inputs["seq_lens"] == LOCAL_LENS
    assert r.graph.layer_nodes(0)[1].attrs["sm_scale"] == pytest.approx(0.8 * default_scale(cfg.head_dim))
    # both RoPE tables' row gathers served only the unfused QK-norm: dropped with it
    assert [n.op for n in r.graph.nodes if n.layer is None] == ["embed", "seq_lens", "fused_head_argmax"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("family", [qwen3_like, gemma_like], ids=["qwen3", "gemma3"])
def test_the_fused_rewrite_decodes_what_the_graph_as_written_decodes(family_operators, family, dtype):
    """Nine steps through a 4-row ring (positions 0-11: the ring wraps twice) and a global layer: every step's
    logits and, after the last, every cache row the same."""
    cfg = _config()
    fused, logits, caches = _decode_both(cfg, family, dtype)
    tol = {torch.float64: 1e-12, torch.float32: 2e-6}[dtype]
    for step, (want, got) in enumerate(zip(logits["written"], logits["fused"])):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=f"step {step}")
    for layer in range(cfg.n_layers):
        torch.testing.assert_close(caches["fused"].k[layer], caches["written"].k[layer], rtol=tol, atol=tol)
        torch.testing.assert_close(caches["fused"].v[layer], caches["written"].v[layer], rtol=tol, atol=tol)
    assert fused.fused["fused_norm_qkv_qknorm_rope"] == cfg.n_layers


def test_an_int4_gemma3_graph_fuses_every_projection_and_decodes_what_it_did_unfused(family_operators):
    cfg = _config()
    fused, logits, _ = _decode_both(cfg, gemma_like, torch.float32, int4=True, steps=6)
    assert fused.fused["fused_attn_proj"] == fused.fused["fused_norm_geglu"] == cfg.n_layers
    for want, got in zip(logits["written"], logits["fused"]):
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)


def test_a_post_norm_added_as_the_adds_first_operand_stays_unfused_and_says_why(family_operators):
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


def _meta_weights(cfg, scheme: str):
    C, F, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    proj = lambda n, k: empty_linear(scheme, n, k, False)  # noqa: E731
    vec = lambda n: torch.empty(n, dtype=torch.float16, device="meta")  # noqa: E731
    blocks = [SimpleNamespace(attn_norm=vec(C), wqkv=proj((cfg.n_heads + 2 * cfg.n_kv_heads) * D, C), q_norm=vec(D),
                              k_norm=vec(D), wo=proj(C, cfg.q_size), post_attn_norm=vec(C), ffn_norm=vec(C),
                              w_gate_up=proj(2 * F, C), w_down=proj(C, F), post_ffn_norm=vec(C))
              for _ in range(cfg.n_layers)]
    head = empty_linear("fp16", cfg.vocab_size, C, False)
    return SimpleNamespace(tok_embeddings=head.weight, blocks=blocks, norm=vec(C), lm_head=head)


# the real shapes (2 of their layers: a local and a global one for Gemma); hidden, intermediate, heads, KV heads,
# head_dim, vocabulary from the models' configs
REAL_SHAPES = {
    "qwen3-0.6b": (qwen3_like, _config(2, C=1024, F=3072, Hq=16, Hkv=8, D=128, vocab=151936)),
    "qwen3-1.7b": (qwen3_like, _config(2, C=2048, F=6144, Hq=16, Hkv=8, D=128, vocab=151936)),
    "qwen3-4b": (qwen3_like, _config(2, C=2560, F=9728, Hq=32, Hkv=8, D=128, vocab=151936)),
    "gemma-3-1b": (lambda b: gemma_like(b, ring=False), _config(2, C=1152, F=6912, Hq=4, Hkv=1, D=256, vocab=262144)),
}


@pytest.mark.parametrize("scheme", ["fp16", "w8a16", "w4a16"])
@pytest.mark.parametrize("model", sorted(REAL_SHAPES))
def test_predicted_kernels_a_layer_of_the_fused_qwen3_and_gemma3_steps(family_operators, model, scheme):
    """Kernels a decode layer launches on the fused path, counted from the operators' launch programs at the default
    tiles (predicted, not measured): Qwen3 as the Llama family's 5; Gemma 3 its fused operators' 6 plus the MLP down
    projection's own linear (a norm sits between it and the residual add), on the Orin's 16 SMs and the H200's 132."""
    from edgekit.graph.launch_count import count_launches

    family, cfg = REAL_SHAPES[model]
    _, r = _graphs(cfg, family, LinearSchemes.uniform(cfg.n_layers, scheme))
    cache = RingCache(cfg, [512] * cfg.n_layers, 1, torch.float16, device="meta")
    for sms in (16, 132):
        c = count_launches(r.graph, _meta_weights(cfg, scheme), cache, batch=1, tokens=1, sm_count=sms,
                           max_shared_bytes=166912)
        ops = c["operators"]
        if family is qwen3_like:
            assert c["per_layer"] == 5, c
        else:
            down = ops[{"fp16": "linear", "w8a16": "linear_w8a16", "w4a16": "linear_w4a16"}[scheme]] // cfg.n_layers
            assert down in (1, 2) and c["per_layer"] == 6 + down, c
        assert c["outside_layers"] == 4  # embedding gather, lengths, fused head GEMV + argmax reduce
        print(f"PREDICTED {model} {scheme} sm={sms}: {c['per_layer']} kernels a layer, {c['outside_layers']} outside")
