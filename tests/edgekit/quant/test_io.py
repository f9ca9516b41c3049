"""The quantized model on disk: an exact round trip, tied heads, KV scales, and clear errors for damaged files."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from edgekit.errors import ModelLoadError
from edgekit.model.weights import random_weights
from edgekit.quant.forward import all_logits
from edgekit.quant.gate import GateConfig
from edgekit.quant.io import REPORT_FILE, write_quantized
from edgekit.model.weights_file import WEIGHTS_FILE, load_weights_file
from edgekit.model.layers import named_linears
from edgekit.quant.quantize import QuantizeOptions, quantize_model

GATE = replace(GateConfig.for_mode("w8a8"), ppl_tokens=256, window_len=128, n_prompts=1, new_tokens=16)


@pytest.fixture(scope="module")
def w8a8_kv(tiny):
    return quantize_model(tiny, "w8a8", kv_int8=True, gate=GATE, options=QuantizeOptions(quantize_head=True))


def test_round_trip_is_exact(w8a8_kv, tmp_path):
    r = w8a8_kv
    paths = write_quantized(tmp_path, r)
    assert [p.name for p in paths] == [WEIGHTS_FILE, REPORT_FILE]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temp files left behind
    back = load_weights_file(tmp_path)
    assert back.config == r.config and back.header["mode"] == "w8a8" and back.header["kv_int8"]
    for (name, a), (name_b, b) in zip(named_linears(r.weights).items(), named_linears(back.weights).items()):
        assert name == name_b and a.op == b.op == "linear_w8a8", name
        assert torch.equal(a.weight, b.weight) and torch.equal(a.scale, b.scale) and torch.equal(a.smooth, b.smooth)
        assert (a.bias is None) == (b.bias is None) and (a.bias is None or torch.equal(a.bias, b.bias))
    assert torch.equal(back.weights.tok_embeddings, r.weights.tok_embeddings)  # already FP16-rounded in memory
    assert all(torch.equal(x, y) for x, y in zip(back.kv_scales.k, r.kv_scales.k))
    tokens = torch.arange(1, 40)[None]
    assert torch.equal(all_logits(back.decoder(), tokens), all_logits(r.decoder(), tokens))
    report = json.loads((tmp_path / REPORT_FILE).read_text())
    assert report["gate"]["passed"] and report["layers"]["lm_head"] == "w8a8"


def test_tied_fp_head_is_stored_once(tmp_path):
    from edgekit.model.loader import LoadedModel, ModelSource
    from edgekit.model.presets import preset_config

    cfg = replace(preset_config("tiny"), tie_embeddings=True, name="tiny-tied")
    m = LoadedModel(cfg, ModelSource("preset", "tiny-tied", seed=0), random_weights(cfg, seed=0))
    r = quantize_model(m, "w8a16", gate=replace(GATE, max_ppl_increase=0.01, min_greedy_agreement=0.95, min_logits_snr_db=20))
    write_quantized(tmp_path, r)
    back = load_weights_file(tmp_path)
    assert back.header["layers"]["lm_head"]["tied"] is True
    assert back.weights.lm_head.weight is back.weights.tok_embeddings
    from safetensors import safe_open

    with safe_open(str(tmp_path / WEIGHTS_FILE), "pt") as f:
        assert not any(k.startswith("lm_head") for k in f.keys())


def test_damaged_files_give_clear_errors(w8a8_kv, tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        load_weights_file(tmp_path / "nowhere")
    write_quantized(tmp_path, w8a8_kv)
    path = tmp_path / WEIGHTS_FILE
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="not a readable safetensors file"):
        load_weights_file(tmp_path)


def test_wrong_format_version_and_bad_scales_are_refused(w8a8_kv, tmp_path):
    from edgekit.model.weights_file import serialize

    r = w8a8_kv
    raw = serialize(r.config, r.weights, r.kv_scales, torch.float16, {"format_version": 99})
    (tmp_path / WEIGHTS_FILE).write_bytes(raw)
    with pytest.raises(ModelLoadError, match="version 99"):
        load_weights_file(tmp_path)
    bad = named_linears(r.weights)["blocks.0.wo"]
    broken = replace(r.weights, blocks=[replace(r.weights.blocks[0], wo=replace(bad, scale=torch.zeros_like(bad.scale)))]
                     + r.weights.blocks[1:])
    (tmp_path / WEIGHTS_FILE).write_bytes(serialize(r.config, broken, r.kv_scales, torch.float16))
    with pytest.raises(ModelLoadError, match=r"blocks\.0\.wo\.scale.*positive scales"):
        load_weights_file(tmp_path)
