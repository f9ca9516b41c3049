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
    # the way out points to a precision that quantizes less, not the W8A16 that just failed
    assert "--precision fp16" in str(e) and "--precision int8" not in str(e)
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

    # the flag a user typed is named first (the message named only the field)
    with pytest.raises(QuantizationError, match=r"^--min-agreement \(min_greedy_agreement\) must be in") as e:
        GateConfig.for_mode("w8a16", min_greedy_agreement=1.5)
    assert "0.95 = 95%" in e.value.hint
    with pytest.raises(QuantizationError, match=r"^--max-ppl-increase \(max_ppl_increase\) must be >= 0"):
        GateConfig.for_mode("w8a16", max_ppl_increase=-1)
    with pytest.raises(QuantizationError, match="unknown quantization mode"):
        GateConfig.for_mode("int4")
    # "nan" and "inf" are floats to click: a NaN SNR bound let every model pass, and report.json's "nan" crashed eval
    for flag, field, value in (("--min-snr-db", "min_logits_snr_db", math.nan),
                               ("--max-ppl-increase", "max_ppl_increase", math.nan),
                               ("--max-ppl-increase", "max_ppl_increase", math.inf)):
        with pytest.raises(QuantizationError, match=rf"^{flag} \({field}\) must be a finite number, got"):
            GateConfig.for_mode("w8a16", **{field: value})


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


def test_a_model_that_scores_the_text_worse_than_a_uniform_guess_is_judged_on_its_own_predictions(tiny, planted):
    """Random preset weights (qwen3-1.7b's: FP perplexity ~3.8e184; its INT8 model +74% on the text, every layer's
    KL 0) cannot be judged by held-out text: the bound then holds exp(mean KL(fp || quant)) - 1. Here a steep head
    and block weights perturbed by 20% (logits SNR ~48 dB, every greedy token kept) give +7% on the text, which
    failed the gate, and ~0.2% by the KL, which passes; a broken layer still fails, and says why."""
    import torch

    from edgekit.quant.gate import JUDGED_BY_KL
    from edgekit.quant.quantize import named_linears

    cfg, ops = tiny.config, DispatchTable()
    text = heldout_eval_text(tiny, GATE)

    def steep(weights):
        return replace(weights, lm_head=LinearWeights("linear", weights.lm_head.weight * 1000.0))

    def gate_of(fp, changed):
        ref = build_reference(Decoder(cfg, fp, ops), text, GATE.new_tokens)
        return evaluate(Decoder(cfg, with_layers(fp, changed), ops), ref)

    g = torch.Generator().manual_seed(0)
    fp = steep(tiny.weights)
    perturbed = {n: LinearWeights("linear", lw.weight * (1 + 0.2 * torch.randn(lw.weight.shape, generator=g)), lw.bias)
                 for n, lw in named_linears(fp).items() if n.startswith("blocks.")}
    sound = gate_of(fp, perturbed)
    assert sound["fp_perplexity"] > cfg.vocab_size and sound["judged_by"] == JUDGED_BY_KL
    assert sound["judged_increase"] == pytest.approx(math.exp(sound["mean_kl_nats"]) - 1.0)
    assert sound["judged_increase"] <= GATE.max_ppl_increase < sound["perplexity_increase"]
    assert check(sound, GATE) == []
    broken_fp = steep(planted.weights)
    broken = gate_of(broken_fp, quantize_layers(broken_fp, "w8a16", None, 0.5, include_head=False))
    assert broken["judged_by"] == JUDGED_BY_KL and broken["judged_increase"] > GATE.max_ppl_increase
    assert any("worse than a uniform guess" in f and f"{cfg.vocab_size} tokens" in f for f in check(broken, GATE))
    # a quantized model whose logits are NaN fails by the KL too (a NaN compares false with every bound)
    nan_layer = {"blocks.0.w_down": LinearWeights("linear", fp.blocks[0].w_down.weight * float("nan"))}
    poisoned = gate_of(fp, nan_layer)
    assert poisoned["judged_by"] == JUDGED_BY_KL and poisoned["judged_increase"] == math.inf
    assert any(f.startswith("perplexity on the FP model's own predictions") for f in check(poisoned, GATE))
    # (a model the text can judge: the real default model, tests/edgekit/quant/test_default_model.py)


def test_a_failure_judged_by_kl_names_the_text_that_was_scored():
    """`eval --text FILE` scores the user's file: a failure there said "the FP model scores the held-out text"."""
    from edgekit.quant.judged_by import JUDGED_BY_KL, JUDGED_BY_TEXT, text_file

    metrics = {"judged_by": JUDGED_BY_KL, "scored_text": text_file("notes.txt"), "judged_increase": 0.5,
               "perplexity_increase": 3.0, "mean_kl_nats": 0.41, "fp_perplexity": 9e9, "quant_perplexity": 3e10,
               "vocab_size": 100, "greedy_agreement": None, "logits_snr_db": 30.0}
    (fail,) = check(metrics, GATE)
    assert "scores the text file notes.txt at perplexity 9e+09" in fail and "held-out" not in fail
    (fail,) = check({**metrics, "scored_text": JUDGED_BY_TEXT}, GATE)  # the gate's own text keeps its name
    assert "scores the held-out text at perplexity" in fail
