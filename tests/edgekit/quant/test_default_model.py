"""The real default model (SmolLM2-135M-Instruct): W8A16 passes the default gate, and the quantized model
generates through the ordinary dispatch table (reference INT8 operators) the tokens the gate scored."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from edgekit.generate import Generator
from edgekit.kernels.dispatch import DispatchTable
from edgekit.quant.forward import all_logits
from edgekit.quant.gate import GateConfig
from edgekit.quant.quantize import heldout_eval_text, quantize_model
from edgekit.shapes import StaticShapes

pytestmark = pytest.mark.slow


def test_w8a16_passes_the_gate_and_generates_the_scored_tokens(default_model):
    # Default thresholds (+1% perplexity, 95% agreement over 128 tokens, 20 dB); a shorter text than
    # the CLI's default so the test stays around a minute on two cores.
    gate = replace(GateConfig.for_mode("w8a16"), ppl_tokens=512, n_prompts=1)
    r = quantize_model(default_model, "w8a16", gate=gate)
    m = r.report["gate"]["metrics"]
    assert r.report["gate"]["passed"], r.report["gate"]["failures"]
    assert m["greedy_positions"] == 128 and m["perplexity_increase"] <= 0.01
    # a real model scores real text better than a uniform guess: the text judges it (gate.JUDGED_BY_TEXT)
    assert m["fp_perplexity"] < m["vocab_size"] and m["judged_by"] == "held-out text"
    assert m["judged_increase"] == m["perplexity_increase"]

    # Greedy generation with the plain reference table (int64 W8A8 product, W8A16 reference) ...
    prompt = heldout_eval_text(default_model, gate).prompts[0]
    dec = r.decoder(DispatchTable())
    out, _ = Generator(dec, StaticShapes.for_context(256)).generate(prompt, 24)
    # ... gives the tokens the gate's teacher-forced pass (evaluation table) ranks first along that sequence.
    seq = torch.tensor([prompt + out])
    forced = all_logits(r.decoder(DispatchTable()), seq)[0].argmax(-1)  # (T,)
    assert forced[len(prompt) - 1 : -1].tolist() == out
