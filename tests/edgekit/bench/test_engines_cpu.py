"""The on-device decode loop (greedy pick fed back into the step) gives the Generator's tokens."""

from __future__ import annotations

import pytest
import torch

from edgekit.bench.engines import CompiledReferenceEngine, GreedyFeedback, SteppedEngine
from edgekit.bench.runner import _cast, quantized, reference_tokens
from edgekit.generate import Generator
from edgekit.model.decoder import Decoder
from edgekit.model.presets import PRESETS
from edgekit.model.weights import random_weights
from edgekit.shapes import StaticShapes

TINY = PRESETS["tiny"]


class EagerFeedbackEngine(SteppedEngine):
    """GreedyFeedback called eagerly: the loop that RuntimeEngine captures in a CUDA graph."""

    def __init__(self, decoder, max_seq_len, max_tokens):
        super().__init__(decoder.config, decoder, max_seq_len, max_tokens)
        self.tokens = torch.zeros(1, dtype=torch.long)
        self.positions = torch.zeros(1, dtype=torch.long)

    def decode(self, first, start_pos, n):
        self._check_n(n)
        self.feedback.reset(self.tokens, self.positions, first, start_pos)
        for _ in range(n):
            self.feedback.decode(self.tokens, self.positions, self.cache)
        return self.feedback.out[:n]


def test_feedback_loop_gives_the_generators_greedy_tokens_and_can_restart():
    dec = Decoder(TINY, random_weights(TINY, seed=11))
    prompt = torch.randint(0, TINY.vocab_size, (1, 30), generator=torch.Generator().manual_seed(1))
    expected, _ = Generator(dec, StaticShapes(buckets=(32,), max_seq_len=64)).generate(prompt[0].tolist(), 13)
    eng = EagerFeedbackEngine(dec, 64, 12)
    first = eng.prefill(prompt)
    assert [int(first[0])] + eng.decode(first, 30, 12).tolist() == expected
    # a second loop from the same start overwrites the same positions and records from index 0 again
    assert [int(first[0])] + eng.decode(first, 30, 12).tolist() == expected
    assert int(eng.feedback.count) == 12


def test_feedback_record_index_wraps_instead_of_running_off_the_buffer():
    dec = Decoder(TINY, random_weights(TINY, seed=2))
    fb = GreedyFeedback(dec, max_tokens=4)
    cache = dec.new_cache(1, 32)
    tokens, positions = torch.tensor([7]), torch.tensor([0])
    picks = [int(fb.decode(tokens, positions, cache)[0]) for _ in range(6)]
    assert fb.out.tolist() == picks[4:6] + picks[2:4]  # indices 4 and 5 landed on 0 and 1
    assert int(positions[0]) == 6 and int(tokens[0]) == picks[-1]


@pytest.mark.parametrize("preset,precision", [("tiny", "int8"), ("tiny-qwen3", "int4-head"), ("tiny-gemma3", "fp16")])
def test_compiled_reference_step_traces_as_one_graph_and_keeps_the_tokens(preset, precision):
    # backend="eager": Dynamo's full-graph capture (no graph break allowed) without Inductor's compile time; each
    # family's graph (QK-norm, post-norms, GeGLU, the embedding scale) and weight scheme goes through the trace
    cfg = PRESETS[preset]
    w = quantized(_cast(random_weights(cfg, seed=5), "cpu", torch.float32), precision)
    prompt = torch.randint(0, cfg.vocab_size, (1, 20), generator=torch.Generator().manual_seed(2))
    eng = CompiledReferenceEngine(cfg, w, 64, 8, backend="eager", mode=None)
    try:
        first = eng.prefill(prompt)
        got = [int(first[0])] + eng.decode(first, 20, 8).tolist()
    finally:
        eng.close()
    assert got == reference_tokens(cfg, w, prompt, 9)


def test_int4_bench_weights_are_w4a16_records_that_decode_like_the_float_model():
    # bench --precision int4(-head): RTN g128 W4A16 on every block linear (and the head), run by the reference table
    w = random_weights(TINY, seed=5)
    w4 = quantized(w, "int4-head")
    records = [lw for b in w4.blocks for lw in b.linears().values()] + [w4.lm_head]
    assert {lw.op for lw in records} == {"linear_w4a16"}
    assert all(lw.weight.dtype == torch.uint8 and lw.offset is not None for lw in records)
    assert quantized(w, "int4").lm_head is w.lm_head  # the head stays float without -head
    x = torch.randint(0, TINY.vocab_size, (1, 12), generator=torch.Generator().manual_seed(2))
    ref = Decoder(TINY, w).prefill(x, torch.tensor([12]), Decoder(TINY, w).new_cache(1, 16))
    got = Decoder(TINY, w4).prefill(x, torch.tensor([12]), Decoder(TINY, w4).new_cache(1, 16))
    # 4-bit rounding moves the logits a little, not a lot (the random model's logits are O(1))
    assert 0 < float((got - ref).abs().max()) < 0.25 * float(ref.abs().max())
