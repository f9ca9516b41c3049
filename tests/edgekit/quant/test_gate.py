"""The accuracy gate: passes a sound quantization, fails on a deliberately broken layer and names it,
and with mixed precision keeps exactly the offending layer in floating point."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from edgekit.kernels.linear import LinearWeights
from edgekit.model.decoder import Decoder
from edgekit.kernels.dispatch import DispatchTable
from edgekit.quant.gate import GateConfig, GateFailedError, build_reference, check, evaluate
from edgekit.model.layers import with_layers
from edgekit.plan.precision import PrecisionPlan
from edgekit.quant.quantize import heldout_eval_text, quantize_layers, quantize_model

sys.path.insert(0, str(Path(__file__).parent))
from planting import plant_sensitive_ffn  # noqa: E402

# A smaller evaluation than the defaults keeps these tests fast; the thresholds are the w8a16 defaults.
GATE = replace(GateConfig.for_mode("w8a16"), ppl_tokens=512, window_len=128, n_prompts=2, new_tokens=32)


@pytest.fixture(scope="module")
def planted(tiny):
    return replace(tiny, weights=plant_sensitive_ffn(tiny.weights, 1))


def test_sound_quantization_passes(tiny):
    r = quantize_model(tiny, "w8a16", gate=GATE)
    g = r.report["gate"]
    assert g["passed"] and g["failures"] == []
    m = g["metrics"]
    assert abs(m["perplexity_increase"]) <= GATE.max_ppl_increase
    assert m["greedy_positions"] == 2 * 32 and m["tokens_scored"] == 512 - 4
    assert set(r.layer_precisions.values()) == {"w8a16", "fp16"}  # fp16: the head, kept FP by default
    assert r.layer_precisions["lm_head"] == "fp16" and r.report["fp_layers"] == []


def test_gate_fails_on_a_deliberately_broken_layer_and_names_it(planted):
    with pytest.raises(GateFailedError) as exc:
        quantize_model(planted, "w8a16", gate=GATE)
    e = exc.value
    assert "blocks.1.w_gate_up" in str(e) and "--allow-mixed" in str(e)
    assert e.report["gate"]["passed"] is False and e.report["gate"]["failures"]
    assert e.report["sensitivity"]["layers"][0]["layer"] == "blocks.1.w_gate_up"


def test_mixed_precision_keeps_the_broken_layer_in_fp(planted):
    r = quantize_model(planted, "w8a16", gate=GATE, allow_mixed=True)
    assert r.report["gate"]["passed"]
    assert r.report["fp_layers"] == ["blocks.1.w_gate_up"] and r.report["mixed_precision"]
    assert r.layer_precisions["blocks.1.w_gate_up"] == "fp16"
    assert r.weights.blocks[1].w_gate_up.op == "linear"
    assert r.layer_precisions["blocks.1.w_down"] == "w8a16"
    attempts = r.report["gate"]["attempts"]
    assert attempts[0]["failures"] and not attempts[-1]["failures"]
    plan = PrecisionPlan.from_quantization(r)  # the choice as the planner records it
    assert plan.layers[1]["w_gate_up"] == "fp16" and plan.layers[1]["w_down"] == "w8a16"
    assert plan.label() == "mixed (w8a16 x7, fp16 x1)" and "blocks.1.w_gate_up" in plan.notes[-1]


def test_check_fails_a_quantized_model_with_one_corrupted_layer(tiny):
    """The gate's measurements, not only the ranking, see a quantizer bug in a single layer."""
    cfg = tiny.config
    q = quantize_layers(tiny.weights, "w8a16", None, 0.5, include_head=False)
    ops = DispatchTable()
    ref = build_reference(Decoder(cfg, tiny.weights, ops), heldout_eval_text(tiny, GATE), GATE.new_tokens)
    good = evaluate(Decoder(cfg, with_layers(tiny.weights, q), ops), ref)
    assert check(good, GATE) == []
    bad_layer = q["blocks.0.w_down"]
    q["blocks.0.w_down"] = LinearWeights(bad_layer.op, -bad_layer.weight, bad_layer.bias, bad_layer.scale * 40.0)
    bad = evaluate(Decoder(cfg, with_layers(tiny.weights, q), ops), ref)
    fails = check(bad, GATE)
    assert fails and bad["logits_snr_db"] < good["logits_snr_db"] - 20


def test_thresholds_are_validated_and_overridable():
    assert GateConfig.for_mode("w8a8").max_ppl_increase == 0.03
    assert GateConfig.for_mode("w8a8", max_ppl_increase=0.05, min_greedy_agreement=None).max_ppl_increase == 0.05
    from edgekit.errors import QuantizationError

    with pytest.raises(QuantizationError, match="min_greedy_agreement must be in"):
        GateConfig.for_mode("w8a16", min_greedy_agreement=1.5)
    with pytest.raises(QuantizationError, match="unknown quantization mode"):
        GateConfig.for_mode("int4")


def test_a_model_scoring_text_past_709_nats_a_token_gets_infinite_perplexities_and_a_finite_ratio(tiny):
    """A random-weight model with a steep LM head (gemma-3-1b's preset: `edgekit build --precision int8` died in
    math.exp) scores the held-out text at more than 709 nats a token: a double cannot hold its perplexity."""
    cfg = tiny.config
    steep = replace(tiny.weights, lm_head=LinearWeights("linear", tiny.weights.lm_head.weight * 3000.0))
    ops = DispatchTable()
    ref = build_reference(Decoder(cfg, steep, ops), heldout_eval_text(tiny, GATE), GATE.new_tokens)
    q = quantize_layers(steep, "w8a16", None, 0.5, include_head=False)
    m = evaluate(Decoder(cfg, with_layers(steep, q), ops), ref)
    assert m["fp_perplexity"] == m["quant_perplexity"] == math.inf
    assert math.isfinite(m["perplexity_increase"]) and m["perplexity_increase"] > -1.0
    assert isinstance(check(m, GATE), list)
