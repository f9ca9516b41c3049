"""#32 row 2: one long prompt with max_tokens 1 while others stream.

Before: the whole prompt was prefilled on the device thread in one piece, and every stream and every new request
stalled for as long (~70 s for 2046 tokens of the default model on a CPU). Now a prompt longer than a chunk is
prefilled a chunk at a time between decode steps: no stream pauses for longer than about one chunk."""

from __future__ import annotations

import threading
import time

import pytest

from edgekit.generate import Generator
from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.model.loader import load_model
from edgekit.runtime.engine import Engine
from edgekit.shapes import StaticShapes

SHAPES = StaticShapes(buckets=(16, 32, 512), max_seq_len=576)
PER_TOKEN_S = 4e-4  # the slowed rmsnorm's cost per row-token: a prefill's cost grows with its tokens, as on a CPU


@pytest.fixture(scope="module")
def model():
    return load_model("preset:tiny", seed=5)


def _costly(x, w, eps):
    time.sleep(PER_TOKEN_S * x[..., 0].numel())  # (B, T, C) or (B, C): B*T row-tokens
    return rmsnorm_reference(x, w, eps)


def test_a_long_prompt_arriving_during_4_streams_pauses_none_longer_than_a_chunk(model):
    e = Engine(model.decoder(), None, SHAPES, max_waiting=4, batch_buckets=(1, 2, 4, 8), prefill_chunk_tokens=32)
    try:
        e.switch_operator("rmsnorm", _costly, "plugin:costly")
        stamps: list[list[float]] = [[] for _ in range(4)]
        streams = [e.submit([3 + i, 4, 5], 60, stop_ids=(), on_token=lambda _, i=i: stamps[i].append(time.perf_counter()))
                   for i in range(4)]
        while min(len(s) for s in stamps) < 5:  # all four are streaming
            time.sleep(0.01)
        long_prompt = e.submit(list(range(6, 486)), 1, stop_ids=())  # 480 tokens, one new token
        assert long_prompt.done.wait(60) and long_prompt.error is None
        for j in streams:
            assert j.done.wait(60) and j.error is None
        units = [s for n, s in e.prefill_units if n == 32 or n == 480 % 32]
        gaps = [b - a for s in stamps for a, b in zip(s, s[1:])]
        whole_s = 480 * 5 * PER_TOKEN_S  # what one piece would have held every stream for (~1 s)
        assert len(units) >= 480 // 32, e.prefill_units
        assert max(gaps) < whole_s / 2.5, (f"a stream paused {max(gaps):.3f} s; one chunk took {max(units):.3f} s, "
                                           f"the whole prompt would hold {whole_s:.2f} s")
    finally:
        e.close()


def test_a_prompt_prefilled_in_chunks_gets_the_tokens_it_gets_alone(model):
    prompts = [list(range(20, 58)), [3, 4, 5], list(range(100, 131))]
    alone = [Generator(model.decoder(), SHAPES).generate(p, 8)[0] for p in prompts]
    e = Engine(model.decoder(), None, SHAPES, max_waiting=4, prefill_chunk_tokens=8)
    try:
        jobs = [e.submit(p, 8, stop_ids=()) for p in prompts]
        for j in jobs:
            assert j.done.wait(30) and j.error is None, j.error
        assert [j.tokens for j in jobs] == alone
        assert sum(1 for n, _ in e.prefill_units if n == 8) >= 38 // 8 + 31 // 8
    finally:
        e.close()
