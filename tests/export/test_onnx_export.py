"""ONNX export of the prefill graph on preset:tiny: parity with the torch reference run by onnxruntime (CPU),
graph structure, the TensorRT-flavoured copy, determinism, INT8 weights and refused inputs.

Tolerances: FP32 and INT8 graphs 1e-3 on the logits (LOGIT_TOLERANCE["float32"]; ~1e-7 measured on tiny),
FP16 0.25 (LOGIT_TOLERANCE["float16"]; ~3e-4 measured on tiny).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import onnx
import pytest
import torch

from edgekit.errors import ExportError, OperatorError, ShapeError
from edgekit.export import CUSTOM_OPS, DOMAIN, LOGIT_TOLERANCE, PLUGIN_NAMESPACE, check_parity, export_onnx
from edgekit.export.parity import onnx_prefill, onnxruntime_session, reference_prefill
from edgekit.kernels.int4_layout import quantize_int4_rtn
from edgekit.kernels.linear import LinearWeights
from edgekit.model.decoder import BlockWeights, ModelWeights
from edgekit.model.loader import load_model

BUCKET = 16
# Ops the graph may use outside edgekit nodes: glue only, never arithmetic that belongs to an operator.
GLUE_OPS = {"Gather", "Expand", "Transpose", "Reshape", "Add", "Sub", "Unsqueeze", "GatherND"}


@pytest.fixture(scope="module")
def tiny():
    return load_model("preset:tiny")


def padded_batch(lengths: list[int], bucket: int = BUCKET, vocab: int = 512, seed: int = 0, pad: int = 0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, vocab, (len(lengths), bucket), generator=g)
    for b, n in enumerate(lengths):
        tokens[b, n:] = pad
    return tokens, torch.tensor(lengths)


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- INT8 weights made here with plain per-channel absmax quantization (independent of edgekit.quant) --------

def quantize(lw: LinearWeights, op: str, smooth: torch.Tensor | None = None) -> LinearWeights:
    w = lw.weight.to(torch.float32)  # (N, K)
    if smooth is not None:
        w = w * smooth[None, :]  # SmoothQuant: the weight takes the factor the activations give up
    scale = w.abs().amax(dim=1).clamp_min(1e-8) / 127.0  # (N,)
    q = torch.clamp(torch.round(w / scale[:, None]), -127, 127).to(torch.int8)
    return LinearWeights(op, q, lw.bias, scale.to(torch.float32), smooth)


def int8_weights(weights: ModelWeights, seed: int = 0) -> ModelWeights:
    """W8A8 with SmoothQuant (+ QKV bias) on wqkv, W8A8 without smooth on wo, W8A16 on the MLP and the head."""
    g = torch.Generator().manual_seed(seed)
    blocks = []
    for b in weights.blocks:
        smooth = torch.rand(b.wqkv.in_features, generator=g) * 1.5 + 0.5  # (K,) in [0.5, 2)
        blocks.append(BlockWeights(
            attn_norm=b.attn_norm, ffn_norm=b.ffn_norm,
            wqkv=quantize(b.wqkv, "linear_w8a8", smooth), wo=quantize(b.wo, "linear_w8a8"),
            w_gate_up=quantize(b.w_gate_up, "linear_w8a16"), w_down=quantize(b.w_down, "linear_w8a16"),
        ))
    return ModelWeights(weights.tok_embeddings, blocks, weights.norm, quantize(weights.lm_head, "linear_w8a16"))


# -- parity -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_logits_match_reference_on_padded_prompt(tiny, tmp_path, dtype):
    r = export_onnx(tiny.config, tiny.weights, BUCKET, tmp_path / "m.onnx", dtype=dtype)
    tokens, lens = padded_batch([11])
    p = check_parity(tiny.config, tiny.weights, r.path, tokens, lens, dtype=dtype)
    print(f"{dtype}: max |logit diff| = {p.max_abs_diff:.3e} (tolerance {p.tolerance})")
    assert p.tolerance == LOGIT_TOLERANCE[dtype]
    assert p.ok and p.argmax_equal


def test_batch_with_different_lengths_matches_reference(tiny, tmp_path):
    r = export_onnx(tiny.config, tiny.weights, BUCKET, tmp_path / "m.onnx", batch=3)
    tokens, lens = padded_batch([1, 9, BUCKET], seed=1)
    p = check_parity(tiny.config, tiny.weights, r.path, tokens, lens)
    assert p.ok and p.argmax_equal, p


def test_padding_tokens_do_not_change_logits(tiny, tmp_path):
    r = export_onnx(tiny.config, tiny.weights, BUCKET, tmp_path / "m.onnx")
    session = onnxruntime_session(r.path)
    a = onnx_prefill(session, *padded_batch([7], pad=0))
    b = onnx_prefill(session, *padded_batch([7], pad=411))
    assert np.array_equal(a, b)
    c = onnx_prefill(session, *padded_batch([8], pad=0))  # one more real token does change them
    assert not np.allclose(a, c)


def test_present_kv_matches_reference_cache(tiny, tmp_path):
    r = export_onnx(tiny.config, tiny.weights, BUCKET, tmp_path / "m.onnx", present_kv=True)
    tokens, lens = padded_batch([10])
    session = onnxruntime_session(r.path)
    names = [o.name for o in session.get_outputs()]
    assert names == ["logits"] + [f"present.{i}.{kv}" for i in range(tiny.config.n_layers) for kv in ("key", "value")]
    outs = dict(zip(names, session.run(None, {"tokens": tokens.numpy(), "seq_lens": lens.numpy()})))
    dec = tiny.decoder()
    cache = dec.new_cache(1, BUCKET)
    dec.prefill(tokens, lens, cache)
    for i in range(tiny.config.n_layers):
        np.testing.assert_allclose(outs[f"present.{i}.key"], cache.k[i].numpy(), atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(outs[f"present.{i}.value"], cache.v[i].numpy(), atol=1e-5, rtol=1e-5)


def test_external_data_runs_and_keeps_the_graph_small(tiny, tmp_path):
    r = export_onnx(tiny.config, tiny.weights, BUCKET, tmp_path / "m.onnx", external_data=True)
    assert r.data_path == tmp_path / "m.onnx.data" and r.data_sha256 == sha256(r.data_path)
    assert r.path.stat().st_size < r.initializer_bytes // 10
    p = check_parity(tiny.config, tiny.weights, r.path, *padded_batch([5]))
    assert p.ok, p


# -- INT8 -------------------------------------------------------------------------------------------------------

def test_int8_weights_export_as_int8_nodes_and_match_reference_int8_ops(tiny, tmp_path):
    weights = int8_weights(tiny.weights)
    r = export_onnx(tiny.config, weights, BUCKET, tmp_path / "q.onnx")
    model = onnx.load(r.path)
    n = tiny.config.n_layers
    assert r.op_counts == {"RMSNorm": 2 * n + 1, "LinearW8A8": 2 * n, "Rope": n, "AttentionPrefill": n,
                           "LinearW8A16": 2 * n + 1, "SwiGLU": n}
    overloads = {(f.name, f.overload) for f in model.functions}
    assert ("LinearW8A8", "with_bias_smooth") in overloads and ("LinearW8A8", "") in overloads
    weight_types = {i.name: i.data_type for i in model.graph.initializer}
    assert weight_types["blocks.0.wqkv.qweight"] == onnx.TensorProto.INT8
    assert weight_types["blocks.0.wqkv.scale"] == onnx.TensorProto.FLOAT
    # The reference decoder routes these LinearWeights to linear_w8a8 / linear_w8a16 (per-token activation quant).
    for lens, seed in (([13], 0), ([4], 3)):
        p = check_parity(tiny.config, weights, r.path, *padded_batch(lens, seed=seed))
        print(f"int8 {lens}: max |logit diff| = {p.max_abs_diff:.3e}")
        assert p.ok and p.argmax_equal, p
    # ... and the graph really computes in INT8: its distance to the float model is quantization error,
    # far above its distance to the INT8 reference.
    float_logits = reference_prefill(tiny.config, tiny.weights, *padded_batch([4], seed=3)).numpy()
    int8_logits = onnx_prefill(onnxruntime_session(r.path), *padded_batch([4], seed=3))
    assert np.abs(int8_logits - float_logits).max() > 100 * p.max_abs_diff


def int4_weights(weights: ModelWeights) -> ModelWeights:
    """W4A16 on every projection: symmetric FP32 scales on the attention, asymmetric FP16 (Q4_1-like) elsewhere."""
    def q4(lw: LinearWeights, symmetric: bool) -> LinearWeights:
        k = lw.in_features
        group = max(g for g in (32, 64, 128) if k % g == 0)
        q, s, off = quantize_int4_rtn(lw.weight, group, symmetric=symmetric,
                                      scale_dtype=torch.float32 if symmetric else torch.float16)
        return LinearWeights("linear_w4a16", q, lw.bias, s, offset=off)

    blocks = [BlockWeights(attn_norm=b.attn_norm, ffn_norm=b.ffn_norm, wqkv=q4(b.wqkv, True), wo=q4(b.wo, True),
                           w_gate_up=q4(b.w_gate_up, False), w_down=q4(b.w_down, False)) for b in weights.blocks]
    return ModelWeights(weights.tok_embeddings, blocks, weights.norm, q4(weights.lm_head, False))


def test_int4_weights_export_packed_and_match_reference_int4_ops(tiny, tmp_path):
    weights = int4_weights(tiny.weights)
    r = export_onnx(tiny.config, weights, BUCKET, tmp_path / "q4.onnx")
    n = tiny.config.n_layers
    assert r.op_counts == {"RMSNorm": 2 * n + 1, "LinearW4A16": 4 * n + 1, "Rope": n, "AttentionPrefill": n,
                           "SwiGLU": n}
    model = onnx.load(r.path)
    types = {i.name: i.data_type for i in model.graph.initializer}
    assert types["blocks.0.wqkv.qweight"] == onnx.TensorProto.UINT8  # stored packed: K/2 bytes a row
    assert types["blocks.0.wqkv.scale"] == onnx.TensorProto.FLOAT and "blocks.0.wqkv.offset" not in types
    assert types["blocks.0.w_down.scale"] == onnx.TensorProto.FLOAT16 == types["blocks.0.w_down.offset"]
    assert {(f.name, f.overload) for f in model.functions} >= {("LinearW4A16", "with_bias"),
                                                                 ("LinearW4A16", "with_offset")}
    p = check_parity(tiny.config, weights, r.path, *padded_batch([13], seed=2))
    assert p.ok and p.argmax_equal, p


def test_int4_record_with_unpacked_weights_is_refused(tiny, tmp_path):
    w = tiny.weights
    blocks = list(w.blocks)
    blocks[0] = replace(blocks[0], wo=LinearWeights("linear_w4a16", blocks[0].wo.weight))  # float weight, no scale
    with pytest.raises(OperatorError, match="blocks.0.wo: linear_w4a16 takes qweight as uint8, got float32"):
        export_onnx(tiny.config, ModelWeights(w.tok_embeddings, blocks, w.norm, w.lm_head), BUCKET, tmp_path / "m.onnx")


def test_int8_record_holding_float_weights_is_refused(tiny, tmp_path):
    blocks = list(tiny.weights.blocks)
    blocks[0] = replace(blocks[0], wo=LinearWeights("linear_w8a16", blocks[0].wo.weight))  # float weight, no scale
    with pytest.raises(OperatorError, match="blocks.0.wo: linear_w8a16 takes qweight as int8, got float32"):
        export_onnx(tiny.config, replace(tiny.weights, blocks=blocks), BUCKET, tmp_path / "m.onnx")


# -- structure ----------------------------------------------------------------------------------------------------

def test_every_operator_is_an_edgekit_node_with_attributes_and_a_function(tiny, tmp_path):
    r = export_onnx(tiny.config, tiny.weights, BUCKET, tmp_path / "m.onnx")
    model = onnx.load(r.path)
    functions = {(f.domain, f.name, f.overload): f for f in model.functions}
    op_types = {op.op_type: op for op in CUSTOM_OPS.values()}
    custom = [n for n in model.graph.node if n.domain == DOMAIN]
    assert {n.op_type for n in custom} == {"RMSNorm", "QKVRoPE", "AttentionPrefill", "Linear", "SwiGLU"}
    assert {n.op_type for n in model.graph.node if n.domain == ""} <= GLUE_OPS
    for node in custom:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["plugin_version"] == str(op_types[node.op_type].spec.abi_version).encode()
        fn = functions[(DOMAIN, node.op_type, node.overload)]  # the fallback this node inlines
        assert set(attrs) <= set(fn.attribute)
        assert all(n.domain == "" for n in fn.node), "fallback bodies use standard ops only"
    attrs = {n.op_type: {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in custom}
    cfg = tiny.config
    assert attrs["RMSNorm"]["eps"] == pytest.approx(cfg.rms_norm_eps)
    assert (attrs["QKVRoPE"]["n_heads"], attrs["QKVRoPE"]["n_kv_heads"]) == (cfg.n_heads, cfg.n_kv_heads)
    assert attrs["AttentionPrefill"]["scale"] == pytest.approx(cfg.head_dim ** -0.5)
    assert model.opset_import[1].domain == DOMAIN
    inputs = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    assert inputs == {"tokens": [1, BUCKET], "seq_lens": [1]}


def test_tensorrt_copy_has_no_functions_and_plugin_attributes(tiny, tmp_path):
    r = export_onnx(tiny.config, tiny.weights, BUCKET, tmp_path / "m.onnx", tensorrt_flavour=True)
    assert r.tensorrt_path == tmp_path / "m.trt.onnx" and r.tensorrt_sha256 == sha256(r.tensorrt_path)
    main, trt = onnx.load(r.path), onnx.load(r.tensorrt_path)
    assert len(main.functions) > 0 and len(trt.functions) == 0
    onnx.checker.check_model(trt, full_check=True)
    custom = [n for n in trt.graph.node if n.domain == DOMAIN]
    assert [n.op_type for n in custom] == [n.op_type for n in main.graph.node if n.domain == DOMAIN]
    abi = {op.op_type: str(op.spec.abi_version).encode() for op in CUSTOM_OPS.values()}
    for node in custom:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["plugin_namespace"] == PLUGIN_NAMESPACE.encode()
        assert attrs["plugin_version"] == abi[node.op_type]  # the operator's ABI version (attention_prefill: 2)
        assert node.overload == ""
    # Without bodies nothing here can run it, and the refusal says so.
    with pytest.raises(ExportError, match="onnxruntime could not load"):
        onnxruntime_session(r.tensorrt_path)


def test_export_is_deterministic(tiny, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for external in (False, True):
        ra = export_onnx(tiny.config, tiny.weights, BUCKET, tmp_path / "a" / "m.onnx", tensorrt_flavour=True,
                         external_data=external)
        rb = export_onnx(tiny.config, load_model("preset:tiny").weights, BUCKET, tmp_path / "b" / "m.onnx",
                         tensorrt_flavour=True, external_data=external)
        assert ra.files() == rb.files()
        assert ra.sha256 == sha256(ra.path)
    other_bucket = export_onnx(tiny.config, tiny.weights, 2 * BUCKET, tmp_path / "a" / "m2.onnx")
    assert other_bucket.sha256 != ra.sha256


# -- refused input --------------------------------------------------------------------------------------------------

def test_refused_arguments_say_what_and_how(tiny, tmp_path):
    with pytest.raises(ShapeError, match="export dtype 'bfloat16' is not supported"):
        export_onnx(tiny.config, tiny.weights, BUCKET, tmp_path / "m.onnx", dtype="bfloat16")
    with pytest.raises(ShapeError, match="bucket 4096 is outside 1..1024"):
        export_onnx(tiny.config, tiny.weights, 4096, tmp_path / "m.onnx")
    with pytest.raises(ExportError, match="must end in .onnx"):
        export_onnx(tiny.config, tiny.weights, BUCKET, tmp_path / "m.bin")
    with pytest.raises(ExportError, match="no such directory"):
        export_onnx(tiny.config, tiny.weights, BUCKET, tmp_path / "missing" / "m.onnx")
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_a_scaled_rope_is_exported_as_the_decoder_runs_it(tiny, tmp_path):
    """The ONNX graph's RoPE tables come from the config's scaling (Llama 3's, a Qwen3's yarn), as the decoder's do."""
    scaled = replace(tiny.config, rope_scaling=(("attention_factor", 1.2), ("beta_fast", 32.0), ("beta_slow", 1.0),
                                                ("factor", 4.0), ("original_max_positions", 8.0), ("truncate", True),
                                                ("type", "yarn")))
    tokens, lens = padded_batch([BUCKET])
    r = export_onnx(scaled, tiny.weights, BUCKET, tmp_path / "s.onnx")
    p = check_parity(scaled, tiny.weights, r.path, tokens, lens)
    assert p.ok and p.argmax_equal, p
    plain = export_onnx(tiny.config, tiny.weights, BUCKET, tmp_path / "p.onnx")
    a = onnx_prefill(onnxruntime_session(r.path), tokens, lens)
    b = onnx_prefill(onnxruntime_session(plain.path), tokens, lens)
    # the tables changed what the graph computes, by far more than it differs from the scaled reference (random
    # weights attend almost uniformly, so RoPE moves tiny's logits by ~1e-4 only; parity is ~1e-7)
    assert np.abs(a - b).max() > 100 * max(p.max_abs_diff, 1e-7)
