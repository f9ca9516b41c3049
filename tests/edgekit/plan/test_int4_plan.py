"""The planner knows INT4 (W4A16): bytes per group, a quantized tied head as its own copy, and what now fits an
8 GB Orin (all figures predicted from shapes, not measured)."""

from __future__ import annotations

import pytest

from edgekit.kernels.int4_layout import quantize_int4_rtn
from edgekit.kernels.linear import LinearWeights
from edgekit.model.presets import preset_config
from edgekit.model.weights import random_weights
from edgekit.plan.memory import plan_memory
from edgekit.plan.precision import PrecisionPlan, linear_bytes
from edgekit.plan.roofline import _streamed_weight_bytes
from edgekit.plan.targets import load_target
from edgekit.model.layers import named_linears, with_layers


def test_int4_bytes_are_half_a_byte_per_weight_plus_group_scales():
    # Q4_1 as GGML stores it: 20 bytes per 32 weights (16 of nibbles, fp16 d and m)
    assert linear_bytes(64, 1024, "w4a16", False, int4_group=32, int4_group_bytes=4) == 64 * 1024 // 32 * 20
    # group 128, symmetric fp16 scales: 64 + 2 bytes per 128 weights
    assert linear_bytes(64, 1024, "w4a16", False, int4_group=128, int4_group_bytes=2) == 64 * 8 * 66
    # K = 160: group 128 does not divide it, so the layer gets group 32 (five groups a row), as calibration makes it
    assert linear_bytes(8, 160, "w4a16", False) == 8 * (80 + 5 * 4)


def test_plan_from_weights_reads_the_real_group_and_scale_bytes():
    cfg = preset_config("preset:tiny")
    w = random_weights(cfg)
    layers = {}
    for name, lw in named_linears(w).items():
        if name != "lm_head":
            q, s, off = quantize_int4_rtn(lw.weight, 32)
            layers[name] = LinearWeights("linear_w4a16", q, lw.bias, s, offset=off)
    pp = PrecisionPlan.from_weights(with_layers(w, layers))
    assert pp.schemes_used() == ["w4a16"] and (pp.int4_group, pp.int4_group_bytes) == (32, 4)
    fp16_bias = sum(2 * lw.bias.numel() for lw in layers.values() if lw.bias is not None)  # stored FP16
    assert pp.weight_bytes(cfg)["blocks_linear"] == sum(lw.weight.numel() + 2 * lw.scale.numel() + 2 * lw.offset.numel()
                                                        for lw in layers.values()) + fp16_bias
    back = PrecisionPlan.from_dict(pp.to_dict())
    assert (back.int4_group, back.int4_group_bytes) == (32, 4)


def test_a_quantized_tied_head_is_its_own_copy_and_what_decode_streams():
    cfg = preset_config("llama-3.2-1b")
    assert cfg.tie_embeddings
    fp_head = PrecisionPlan.uniform(cfg, "w4a16")
    q_head = PrecisionPlan.uniform(cfg, "w4a16")
    q_head.lm_head = "w4a16"
    head = linear_bytes(cfg.vocab_size, cfg.hidden_size, "w4a16", False)
    assert fp_head.weight_bytes(cfg)["lm_head"] == 0 and q_head.weight_bytes(cfg)["lm_head"] == head
    emb = cfg.vocab_size * cfg.hidden_size * 2
    assert _streamed_weight_bytes(cfg, fp_head) - _streamed_weight_bytes(cfg, q_head) == emb - head
    fp16 = _streamed_weight_bytes(cfg, PrecisionPlan.uniform(cfg, "fp16"))
    # with the head in INT4 too, a decode step streams about a quarter of FP16's bytes (group 128, fp16 scale+offset)
    assert 0.25 < _streamed_weight_bytes(cfg, q_head) / fp16 < 0.29


@pytest.mark.parametrize("preset,fits", [("mistral-7b", {"w4a16"}), ("llama-3.2-3b", {"w8a16", "w4a16"}),
                                         ("llama-3.2-1b", {"fp16", "w8a16", "w4a16"})])
def test_what_fits_an_8gb_orin_nano(preset, fits):
    cfg, target = preset_config(preset), load_target("orin-nano-8gb")
    got = {s for s in ("fp16", "w8a16", "w4a16")
           if plan_memory(cfg, target, PrecisionPlan.uniform(cfg, s), context=4096, batch=1, max_bucket=512,
                          decode_slots=32).fits}
    assert got == fits
