"""Parity with transformers on the real default model (SmolLM2-135M-Instruct), FP32 on the CPU.

Both load the same GGUF file independently (edgekit's loader vs transformers' GGUF integration).
Tolerance: max |logit difference| <= 5e-4 (3.9e-5 measured) at the last position (logits are O(10); FP32 kernels
accumulate in different orders), and 32 greedy tokens identical.
"""

from __future__ import annotations

import pytest
import torch

LOGIT_TOLERANCE = 5e-4


@pytest.fixture(scope="module")
def hf_reference(default_model):
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    path = Path(default_model.source.location)
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


@pytest.mark.slow
def test_last_position_logits_match_transformers(default_model, hf_reference):
    ids = default_model.tokenizer.encode_chat("What is the capital of France?")
    dec = default_model.decoder()
    bucket = 64  # padded: the padding must not change the logits
    tokens = torch.full((1, bucket), default_model.tokenizer.pad_token_id)
    tokens[0, : len(ids)] = torch.tensor(ids)
    ours = dec.prefill(tokens, torch.tensor([len(ids)]), dec.new_cache(1, 128))[0]
    with torch.no_grad():
        theirs = hf_reference(torch.tensor([ids])).logits[0, -1]
    diff = (ours - theirs).abs().max().item()
    print(f"max |logit diff| = {diff:.3e} (tolerance {LOGIT_TOLERANCE})")
    assert diff <= LOGIT_TOLERANCE
    assert int(ours.argmax()) == int(theirs.argmax())


@pytest.mark.slow
def test_32_greedy_tokens_match_transformers(default_model, hf_reference):
    from edgekit.generate import Generator
    from edgekit.shapes import StaticShapes

    ids = default_model.tokenizer.encode("The history of the Roman Empire began")
    ours, _ = Generator(default_model.decoder(), StaticShapes.for_context(256)).generate(ids, 32)
    with torch.no_grad():
        out = hf_reference.generate(
            torch.tensor([ids]), max_new_tokens=32, min_new_tokens=32, do_sample=False, attention_mask=torch.ones(1, len(ids), dtype=torch.long)
        )
    theirs = out[0, len(ids):].tolist()
    assert ours == theirs, (default_model.tokenizer.decode(ours), default_model.tokenizer.decode(theirs))


@pytest.mark.slow
def test_answers_the_capital_question(default_model):
    from edgekit.generate import Generator
    from edgekit.shapes import StaticShapes

    ids = default_model.tokenizer.encode_chat("What is the capital of France?")
    out, _ = Generator(default_model.decoder(), StaticShapes.for_context(256)).generate(
        ids, 24, stop_ids=default_model.config.eos_token_ids
    )
    assert "Paris" in default_model.tokenizer.decode(out)
