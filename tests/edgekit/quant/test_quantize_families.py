"""INT8 and INT4 quantization of Qwen3 and Gemma 3 through the same quantizer: the calibration forward walks their
graphs (QK-norms, post-norms, windows), every block projection takes the scheme, the gate passes, and an INT8 KV
cache calibrated on the teacher-forced windows serves Gemma's ring layers."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from edgekit.model.layers import layer_names
from edgekit.model.loader import load_model
from edgekit.quant.gate import GateConfig
from edgekit.quant.quantize import QuantizeOptions, quantize_model

FAST = dict(calibration_tokens=512, calibration_window_len=128, sensitivity_tokens=64)


def _model(preset: str):
    m = load_model(f"preset:{preset}", seed=1)
    g = torch.Generator().manual_seed(2)
    for b in m.weights.blocks:  # the preset's norms are 1: perturb them so calibration meets every norm's effect
        for t in b.norms().values():
            t.add_(torch.randn(t.shape, generator=g) * 0.3)
    return m


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-gemma3"])
@pytest.mark.parametrize("mode, kv_int8", [("w8a16", True), ("w4a16", False)])
def test_int8_and_int4_quantization_pass_the_gate(preset, mode, kv_int8):
    m = _model(preset)
    gate = replace(GateConfig.for_mode(mode), ppl_tokens=512, window_len=128, n_prompts=2, new_tokens=32)
    r = quantize_model(m, mode, kv_int8=kv_int8, gate=gate, options=QuantizeOptions(**FAST))
    assert r.report["gate"]["passed"], r.report["gate"]["failures"]
    blocks = layer_names(m.config.n_layers, include_head=False)
    assert {r.layer_precisions[n] for n in blocks} == {mode}
    assert (r.kv_scales is not None) == kv_int8
    for b, q in zip(m.weights.blocks, r.weights.blocks):  # the family's norms travel with the quantized weights
        assert set(q.norms()) == set(b.norms())
