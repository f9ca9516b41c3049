"""ONNX export of a tied model whose LM head is quantized: the embedding gather reads the head's INT8 / INT4
initializers (no float table in the graph) and the graph matches the torch reference run by onnxruntime."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest
import torch

from edgekit.export import check_parity, export_onnx
from edgekit.kernels.int4_layout import quantize_int4_rtn
from edgekit.kernels.int8_group_layout import quantize_int8_grouped
from edgekit.kernels.linear import LinearWeights
from edgekit.model.presets import preset_config
from edgekit.model.weights import random_weights
from edgekit.model.layers import HEAD, with_layers

BUCKET = 16


def _int8(w: torch.Tensor) -> LinearWeights:
    scale = w.abs().amax(dim=1) / 127.0
    return LinearWeights("linear_w8a16", torch.clamp(torch.round(w / scale[:, None]), -127, 127).to(torch.int8), None,
                         scale.to(torch.float32))


def _int4(w: torch.Tensor, symmetric: bool) -> LinearWeights:
    q, s, off = quantize_int4_rtn(w, 32, symmetric=symmetric, scale_dtype=torch.float16)
    return LinearWeights("linear_w4a16", q, None, s, offset=off)


def _int8_g32(w: torch.Tensor) -> LinearWeights:  # a Q8_0 table as taken in
    q, s = quantize_int8_grouped(w, 32)
    return LinearWeights("linear_w8a16_grouped", q, None, s)


HEADS = {"int8": _int8, "int4_asym": lambda w: _int4(w, False), "int4_sym": lambda w: _int4(w, True), "int8_g32": _int8_g32}


@pytest.mark.parametrize("kind", sorted(HEADS))
def test_tied_quantized_head_exports_without_a_float_table(kind, tmp_path):
    cfg = replace(preset_config("tiny"), tie_embeddings=True, name="tiny-tied")
    fp = random_weights(cfg, seed=0)
    weights = with_layers(fp, {HEAD: HEADS[kind](fp.tok_embeddings.to(torch.float32))})
    assert weights.tok_embeddings is not fp.tok_embeddings and weights.tied
    r = export_onnx(cfg, weights, BUCKET, tmp_path / "tied.onnx")
    model = onnx.load(r.path)
    init = {i.name: i for i in model.graph.initializer}
    assert "tok_embeddings" not in init
    table = cfg.vocab_size * cfg.hidden_size
    floats = [n for n, i in init.items() if i.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
              and int(np.prod(i.dims)) >= table]
    assert floats == []  # the only (V, C) matrix is the head's codes
    assert init["lm_head.qweight"].data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)
    if kind == "int8_g32":
        assert init["lm_head.scale"].data_type == onnx.TensorProto.FLOAT16  # the Q8_0 scales as stored
    g = torch.Generator().manual_seed(1)
    for lens in ([13], [4]):
        tokens = torch.randint(3, cfg.vocab_size, (len(lens), BUCKET), generator=g)
        p = check_parity(cfg, weights, r.path, tokens, torch.tensor(lens))
        assert p.ok and p.argmax_equal, p
