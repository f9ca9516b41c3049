"""Generation over static shapes: padding must not change the answer, decode must match a full recompute."""

from __future__ import annotations

import torch

from edgekit.generate import Generator, SamplingConfig
from edgekit.model.loader import load_model
from edgekit.shapes import StaticShapes


def _greedy_by_recompute(dec, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens computed by re-running the whole unpadded sequence each step (no KV cache reuse)."""
    seq, out = list(prompt), []
    for _ in range(n):
        cache = dec.new_cache(1, 128)
        logits = dec.prefill(torch.tensor([seq]), torch.tensor([len(seq)]), cache)
        tok = int(logits.argmax(-1)[0])
        out.append(tok)
        seq.append(tok)
    return out


def test_cached_decode_matches_full_recompute_and_padding_is_invisible():
    m = load_model("preset:tiny", seed=7)
    dec = m.decoder()
    prompt = [5, 9, 200, 31, 77]  # 5 tokens padded to a bucket of 16
    gen = Generator(dec, StaticShapes(buckets=(16, 32), max_seq_len=64), pad_token_id=0)
    out, stats = gen.generate(prompt, 12)
    assert stats.bucket == 16 and stats.prompt_tokens == 5 and stats.new_tokens == 12
    assert out == _greedy_by_recompute(dec, prompt, 12)


def test_pad_token_value_does_not_change_the_answer():
    m = load_model("preset:tiny", seed=7)
    dec = m.decoder()
    shapes = StaticShapes(buckets=(16,), max_seq_len=64)
    a, _ = Generator(dec, shapes, pad_token_id=0).generate([3, 4, 5], 8)
    b, _ = Generator(dec, shapes, pad_token_id=311).generate([3, 4, 5], 8)
    assert a == b


def test_batched_prefill_with_different_lengths_matches_single():
    m = load_model("preset:tiny", seed=2)
    dec = m.decoder()
    p1, p2 = [1, 2, 3, 4, 5, 6, 7], [9, 8, 7]
    tokens = torch.zeros(2, 8, dtype=torch.long)
    tokens[0, :7], tokens[1, :3] = torch.tensor(p1), torch.tensor(p2)
    both = dec.prefill(tokens, torch.tensor([7, 3]), dec.new_cache(2, 32))
    one = dec.prefill(torch.tensor([p2]), torch.tensor([3]), dec.new_cache(1, 32))
    assert torch.allclose(both[1], one[0], atol=1e-5)


def test_stop_token_ends_generation():
    m = load_model("preset:tiny", seed=7)
    dec = m.decoder()
    gen = Generator(dec, StaticShapes(buckets=(16,), max_seq_len=64))
    first, _ = gen.generate([5, 9], 3)
    out, _ = gen.generate([5, 9], 10, stop_ids=(first[0],))
    assert out == [first[0]]


def test_sampling_is_seeded():
    m = load_model("preset:tiny", seed=7)
    gen = Generator(m.decoder(), StaticShapes(buckets=(16,), max_seq_len=64))
    a, _ = gen.generate([5, 9], 10, sampling=SamplingConfig(temperature=1.0, seed=1))
    b, _ = gen.generate([5, 9], 10, sampling=SamplingConfig(temperature=1.0, seed=1))
    assert a == b


def test_a_prefill_step_replaces_the_decoder_prefill():
    """The Generator prefills through ``prefill_step`` when given one (how `run` plugs in GraphedPrefill)."""
    m = load_model("preset:tiny", seed=7)
    dec = m.decoder()
    shapes = StaticShapes(buckets=(16,), max_seq_len=64)
    calls = []

    def prefill_step(tokens, seq_lens, cache):
        calls.append(tuple(tokens.shape))
        return dec.prefill(tokens, seq_lens, cache)

    a, _ = Generator(dec, shapes, pad_token_id=0).generate([3, 4, 5], 6)
    b, _ = Generator(dec, shapes, pad_token_id=0, prefill_step=prefill_step).generate([3, 4, 5], 6)
    assert a == b and calls == [(1, 16)]


def test_a_generator_over_shapes_planned_for_4_sequences_decodes_its_one_sequence():
    """`edgekit run` of a bundle planned for batch 4 failed at its first decode step: the Generator's cache had 4
    rows for its 1 sequence ("shape '[1, 4, 16]' is invalid for input of size 256")."""
    m = load_model("preset:tiny", seed=7)
    alone, _ = Generator(m.decoder(), StaticShapes(buckets=(16,), max_seq_len=64)).generate([5, 9], 6)
    gen = Generator(m.decoder(), StaticShapes(buckets=(16,), max_seq_len=64, batch=4))
    assert gen.generate([5, 9], 6)[0] == alone and gen.cache.batch == 1


def test_a_prompt_longer_than_the_largest_bucket_is_prefilled_in_chunks_and_answers_the_same():
    """A context past twice the largest bucket (2048) kept prompts to 2048 tokens: `generate --context 8192` refused
    a 3080-token prompt that `--context 4096` took. The cache bounds a prompt now; the bucket is the chunk."""
    import pytest

    from edgekit.errors import ShapeError

    m = load_model("preset:tiny", seed=7)
    dec = m.decoder()
    prompt = [(13 * i + 5) % m.config.vocab_size for i in range(70)]
    chunked = Generator(dec, StaticShapes(buckets=(16, 32), max_seq_len=96))
    out, stats = chunked.generate(prompt, 12)
    assert stats.prefill_chunks == 3 and stats.bucket == 32 and stats.prompt_tokens == 70
    assert "3 chunks of 32" in stats.prompt_summary()
    whole, whole_stats = Generator(dec, StaticShapes(buckets=(16, 96), max_seq_len=96)).generate(prompt, 12)
    assert whole_stats.prefill_chunks == 0 and out == whole == _greedy_by_recompute(dec, prompt, 12)
    assert len(set(out)) > 4  # the model's choices change: the comparison saw them
    from edgekit.generate import GenerationStats

    want = dec.prefill(torch.tensor([prompt]), torch.tensor([70]), dec.new_cache(1, 96))
    got = Generator(dec, StaticShapes(buckets=(16, 32), max_seq_len=96))._prefill_in_chunks(prompt, 32, GenerationStats())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # the cache still bounds it: 70 + 30 > 96, and the error says so
    with pytest.raises(ShapeError, match="the KV cache holds 96 tokens and 30 are reserved"):
        chunked.generate(prompt, 30)
