"""W4A16 layers in the quantized-model file: bit-exact round trip of packed weights, fp16/fp32 group scales
(negative ones too, as GGML Q4_0 writes them) and optional offsets; damaged W4A16 entries are refused clearly."""

from __future__ import annotations

import json

import pytest
import torch

from edgekit.errors import ModelLoadError
from edgekit.kernels.int4_layout import quantize_int4_rtn
from edgekit.kernels.linear import LinearWeights
from edgekit.model.presets import preset_config
from edgekit.model.weights import random_weights
from edgekit.model.weights_file import WEIGHTS_FILE, _metadata, load_weights_file, serialize
from edgekit.model.layers import named_linears, with_layers


def _int4(lw: LinearWeights, group: int, symmetric: bool, scale_dtype: torch.dtype) -> LinearWeights:
    group = max(g for g in (32, 64, 128) if g <= group and lw.in_features % g == 0)
    q, s, off = quantize_int4_rtn(lw.weight, group, symmetric=symmetric, scale_dtype=scale_dtype)
    if symmetric:
        s = s.clone()
        s[::2] = -s[::2]  # GGML Q4_0 stores d = max / -8: negative scales must survive the file
    return LinearWeights("linear_w4a16", q, lw.bias, s, offset=off)


@pytest.fixture(scope="module")
def int4_model():
    cfg = preset_config("preset:tiny")
    w = random_weights(cfg, seed=3)
    forms = [(32, False, torch.float16), (64, True, torch.float16), (128, False, torch.float32), (32, True, torch.float32)]
    layers = {name: _int4(lw, *forms[i % len(forms)]) for i, (name, lw) in enumerate(named_linears(w).items())
              if name != "lm_head"}
    return cfg, with_layers(w, layers)


def test_w4a16_round_trip_is_bit_exact(int4_model, tmp_path):
    cfg, w = int4_model
    (tmp_path / WEIGHTS_FILE).write_bytes(serialize(cfg, w, None, torch.float32, {"mode": "w4a16"}))
    back = load_weights_file(tmp_path)
    for (name, a), b in zip(named_linears(w).items(), named_linears(back.weights).values()):
        assert a.op == b.op, name
        if a.op != "linear_w4a16":
            continue
        assert b.weight.dtype == torch.uint8 and torch.equal(a.weight, b.weight), name
        assert b.scale.dtype == a.scale.dtype and torch.equal(a.scale, b.scale), name  # never widened or rounded
        assert (a.offset is None) == (b.offset is None) and (a.offset is None or torch.equal(a.offset, b.offset)), name
        assert torch.equal(a.dequantized(), b.dequantized()), name
    groups = {m.get("group") for m in back.header["layers"].values() if m["op"] == "linear_w4a16"}
    assert groups == {32, 64}  # the tiny preset's K (64, 160) admits no group 128
    tokens, lens = torch.tensor([[3, 1, 4, 1, 5, 9]]), torch.tensor([6])
    d0, d1 = back.decoder(), type(back.decoder())(cfg, w)
    assert torch.equal(d0.prefill(tokens, lens, d0.new_cache(1, 16)), d1.prefill(tokens, lens, d1.new_cache(1, 16)))


def _rewrite(tmp_path, cfg, w, edit_header=None, edit_tensors=None):
    from safetensors.torch import load, save

    raw = serialize(cfg, w, None, torch.float32, {"mode": "w4a16"})
    header, tensors = json.loads(_metadata(raw)["edgekit"]), load(raw)
    if edit_header:
        edit_header(header)
    if edit_tensors:
        edit_tensors(tensors)
    (tmp_path / WEIGHTS_FILE).write_bytes(save(tensors, metadata={"edgekit": json.dumps(header)}))


def test_damaged_w4a16_entries_are_refused(int4_model, tmp_path):
    cfg, w = int4_model

    def bad_group(h):
        h["layers"]["blocks.0.wqkv"]["group"] = 48

    _rewrite(tmp_path, cfg, w, edit_header=bad_group)
    with pytest.raises(ModelLoadError, match="blocks.0.wqkv has group 48"):
        load_weights_file(tmp_path)

    def nan_scale(t):
        t["blocks.0.wo.scale"][0, 0] = float("nan")

    _rewrite(tmp_path, cfg, w, edit_tensors=nan_scale)
    with pytest.raises(ModelLoadError, match="blocks.0.wo.scale.*non-finite entries"):
        load_weights_file(tmp_path)

    def signed_codes(t):
        t["blocks.0.w_down.qweight"] = t["blocks.0.w_down.qweight"].view(torch.int8)

    _rewrite(tmp_path, cfg, w, edit_tensors=signed_codes)
    with pytest.raises(ModelLoadError, match="blocks.0.w_down.qweight.*expected torch.uint8"):
        load_weights_file(tmp_path)
