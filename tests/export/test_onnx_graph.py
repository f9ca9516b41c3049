"""The ONNX export is a walk of the declared prefill graph (edgekit/graph): its edgekit nodes are the graph's
registry-operator nodes in order, its glue nodes the graph's glue, and onnxruntime's logits match the decoder's
for FP16, W8A16 and W4A16 weights of preset:tiny (tolerance LOGIT_TOLERANCE["float32"] = 1e-3)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import onnx
import pytest
import torch

from edgekit.errors import ExportError, OperatorError
from edgekit.export import CUSTOM_OPS, DOMAIN, check_parity, export_onnx
from edgekit.export.onnx_glue import GLUE_EMITTERS
from edgekit.export.onnx_graph import build_prefill_model
from edgekit.graph.builder import LinearSchemes
from edgekit.graph.glue import is_glue
from edgekit.graph.node import PREFILL
from edgekit.graph.paths import path_graph
from edgekit.kernels.linear import LinearWeights
from edgekit.model.loader import load_model
from edgekit.model.presets import preset_config
from edgekit.model.weights import random_weights
from edgekit.quant.int4_rounding import rtn_record
from edgekit.model.layers import named_linears, with_layers
from edgekit.quant.weights import quantize_linear

BUCKET = 16
SCHEMES = {
    "fp16": lambda name, lw: lw,
    "w8a16": lambda name, lw: quantize_linear(lw, "w8a16", name),
    "w4a16": lambda name, lw: rtn_record(lw.weight, lw.bias, 32, False, torch.float16),
}
LINEAR_OP_TYPE = {"fp16": "Linear", "w8a16": "LinearW8A16", "w4a16": "LinearW4A16"}


@pytest.fixture(scope="module")
def tiny():
    return load_model("preset:tiny")


def weights_in(scheme: str, fp):
    return with_layers(fp, {name: SCHEMES[scheme](name, lw) for name, lw in named_linears(fp).items()})


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_exported_edgekit_nodes_are_the_prefill_graphs_operator_nodes_in_order(tiny, tmp_path, scheme):
    weights = weights_in(scheme, tiny.weights)
    graph = path_graph(tiny.config, LinearSchemes.of_weights(weights), PREFILL)
    want = [(CUSTOM_OPS[n.op].op_type, n.name) for n in graph.nodes if not is_glue(n.op)]
    r = export_onnx(tiny.config, weights, BUCKET, tmp_path / "m.onnx", batch=2)
    model = onnx.load(r.path)
    got = [(n.op_type, n.name) for n in model.graph.node if n.domain == DOMAIN]
    assert got == want
    assert r.op_counts == Counter(op_type for op_type, _ in want)
    assert LINEAR_OP_TYPE[scheme] in r.op_counts  # the projections really run on the scheme's operator
    tokens = torch.randint(3, tiny.config.vocab_size, (2, BUCKET), generator=torch.Generator().manual_seed(4))
    p = check_parity(tiny.config, weights, r.path, tokens, torch.tensor([13, 5]))
    print(f"{scheme}: max |logit diff| = {p.max_abs_diff:.3e} (tolerance {p.tolerance})")
    assert p.ok and p.argmax_equal, p


def test_tied_float_embedding_is_one_initializer(tmp_path):
    cfg = replace(preset_config("tiny"), tie_embeddings=True, name="tiny-tied")
    weights = random_weights(cfg, seed=0)
    assert weights.lm_head.weight is weights.tok_embeddings
    model, _ = build_prefill_model(cfg, weights, BUCKET)
    table = cfg.vocab_size * cfg.hidden_size
    big = [i.name for i in model.graph.initializer if len(i.raw_data) >= 4 * table]
    assert big == ["tok_embeddings"]
    head = next(n for n in model.graph.node if n.name == "lm_head")
    assert head.input[1] == "tok_embeddings"


def test_a_glue_op_without_an_emitter_is_refused_by_name(tiny, monkeypatch):
    monkeypatch.delitem(GLUE_EMITTERS, "merge_heads")
    with pytest.raises(ExportError, match="blocks.0/merge_heads: the glue op 'merge_heads' has no ONNX emitter"):
        build_prefill_model(tiny.config, tiny.weights, BUCKET)


def test_an_operator_without_an_onnx_function_is_refused_by_name(tiny, monkeypatch):
    monkeypatch.delitem(CUSTOM_OPS, "swiglu")
    with pytest.raises(ExportError, match="blocks.0/swiglu: operator 'swiglu' declares no ONNX function"):
        build_prefill_model(tiny.config, tiny.weights, BUCKET)


def _with_wo(tiny, wo: LinearWeights):
    blocks = list(tiny.weights.blocks)
    blocks[0] = replace(blocks[0], wo=wo)
    return replace(tiny.weights, blocks=blocks)


def test_int8_record_without_its_scale_is_refused(tiny):
    q = quantize_linear(tiny.weights.blocks[0].wo, "w8a16", "blocks.0.wo")
    with pytest.raises(OperatorError, match="blocks.0.wo: linear_w8a16 needs scale, which the weights do not have"):
        build_prefill_model(tiny.config, _with_wo(tiny, replace(q, scale=None)), BUCKET)


def test_a_record_field_its_operator_does_not_take_is_refused_not_dropped(tiny):
    q = quantize_linear(tiny.weights.blocks[0].wo, "w8a16", "blocks.0.wo")
    smooth = torch.ones(q.in_features)  # a SmoothQuant divisor: only linear_w8a8 applies one
    with pytest.raises(OperatorError, match="blocks.0.wo: the linear_w8a16 weights carry a smooth"):
        build_prefill_model(tiny.config, _with_wo(tiny, replace(q, smooth=smooth)), BUCKET)


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-gemma3"])
def test_qwen3_and_gemma3_export_as_their_graphs_and_match_the_decoder(tmp_path, preset):
    """QKNormRope, GeGLU and the windowed AttentionPrefill from the same graph walk; Gemma's bucket of 16 spans its
    window of 4 (and a padded row past its window), and its logits still match."""
    m = load_model(f"preset:{preset}", seed=3)
    g = torch.Generator().manual_seed(9)
    for b in m.weights.blocks:  # perturb the norms the random preset sets to 1, so each one shows
        for t in b.norms().values():
            t.add_(torch.randn(t.shape, generator=g) * 0.3)
    r = export_onnx(m.config, m.weights, BUCKET, tmp_path / "m.onnx", batch=2)
    assert r.op_counts["QKNormRope"] == m.config.n_layers and ("GeGLU" in r.op_counts) == (preset == "tiny-gemma3")
    attention = [n for n in onnx.load(r.path).graph.node if n.op_type == "AttentionPrefill"]
    windows = [onnx.helper.get_attribute_value(a) for n in attention for a in n.attribute if a.name == "window"]
    assert windows == [m.config.window(i) for i in range(m.config.n_layers)]
    tokens = torch.randint(3, m.config.vocab_size, (2, BUCKET), generator=g)
    p = check_parity(m.config, m.weights, r.path, tokens, torch.tensor([16, 5]))
    assert p.ok and p.argmax_equal, p
