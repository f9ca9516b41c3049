"""Self-generated calibration text (tiny preset): sequences continue their prompts with tokens sampled from the FP
model, reproducibly by seed, and prompts come only from the part of the calibration text the tuning may see."""

from __future__ import annotations

import pytest
import torch

from edgekit.errors import QuantizationError
from edgekit.kernels.dispatch import DispatchTable
from edgekit.model.decoder import Decoder
from edgekit.quant import corpus
from edgekit.quant.forward import all_logits
from edgekit.quant.self_generated import interleave, passage_prompts, sample_sequences


@pytest.fixture(scope="module")
def decoder(tiny):
    return Decoder(tiny.config, tiny.weights.to(dtype=torch.float32), DispatchTable())


def test_sequences_keep_their_prompts_and_are_reproducible_by_seed(decoder):
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    a = sample_sequences(decoder, prompts, 24, seed=0)
    assert [s.shape for s in a] == [(1, 24)] * 3
    assert [s[0, :4].tolist() for s in a] == prompts
    again, other = sample_sequences(decoder, prompts, 24, seed=0), sample_sequences(decoder, prompts, 24, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a, again))
    assert not all(torch.equal(x, y) for x, y in zip(a, other))


def test_sampled_tokens_follow_the_model(decoder):
    """Sharpened to near-greedy (logits x 1000), sampling must pick the model's argmax at almost every position;
    sequences that ignored the model (e.g. a fixed or uniform token stream) would not."""
    sharp = Decoder(decoder.config, decoder.weights, DispatchTable())
    sharp.weights = type(decoder.weights)(decoder.weights.tok_embeddings, decoder.weights.blocks,
                                          decoder.weights.norm * 1000, decoder.weights.lm_head)
    seqs = sample_sequences(sharp, [[1, 2, 3, 4]] * 4, 20, seed=0)
    agree = total = 0
    for s in seqs:
        argmax = all_logits(sharp, s)[0, 3:-1].argmax(-1)  # the prediction for each generated position
        agree += int((argmax == s[0, 4:]).sum())
        total += s.shape[1] - 4
    assert agree >= 0.95 * total, (agree, total)


def test_prompts_only_from_the_text_the_tuning_sees(tiny):
    text = corpus.shipped_text(corpus.CALIBRATION_FILE)
    ids = corpus.tokenize(text, tiny.tokenizer, tiny.config.vocab_size)
    passages = corpus.passages(text)
    first = corpus.tokenize(passages[0], tiny.tokenizer, tiny.config.vocab_size)[:8]
    later = corpus.tokenize(passages[-1], tiny.tokenizer, tiny.config.vocab_size)[:8]
    prompts = passage_prompts(passages, tiny.tokenizer, tiny.config.vocab_size, ids[:len(ids) // 2], 100)
    assert len(prompts) == 100 and all(len(p) == 8 for p in prompts)
    assert first in prompts and later not in prompts
    with pytest.raises(QuantizationError, match="no passage of the calibration text"):
        passage_prompts(passages, tiny.tokenizer, tiny.config.vocab_size, ids[1:5], 3)


def test_bad_prompts_are_refused(decoder):
    with pytest.raises(QuantizationError, match="expected one prompt length"):
        sample_sequences(decoder, [[1, 2], [3, 4, 5]], 16, seed=0)
    with pytest.raises(QuantizationError, match="at least one prompt"):
        sample_sequences(decoder, [], 16, seed=0)


def test_interleave():
    a, b = [torch.zeros(1)] * 3, [torch.ones(1)]
    assert [float(t) for t in interleave(a, b)] == [0, 1, 0, 0]
