"""#32 row 8 (32 clients ignoring Retry-After; admitted requests' time to first token): on a CPU a short prompt that
arrives while rows decode is prefilled inside the decode step, between two of its operators, and its first token
goes out at once, instead of after the rest of the step. Its keys and values are copied into its row after the
step; from then on it decodes with the others.

These tests make a request arrive inside a step deterministically (it is submitted from an operator of that step)
and check that it is prefilled there, and that every request still gets the tokens it gets alone: a wrong copy of
the keys and values (a ring layer, a row number) would change them."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from edgekit.generate import Generator
from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.model.decoder import Decoder
from edgekit.model.loader import load_model
from edgekit.runtime.engine import Engine
from edgekit.shapes import StaticShapes

SHAPES = StaticShapes(buckets=(16, 32, 64), max_seq_len=128)


class _ArrivalsInsideAStep:
    """An rmsnorm that, in the ``at``-th decode-step call after ``arm()``, submits the prompts to the engine: the
    engine is inside that step, between two operators, when they arrive. Decode calls are (B, C); a prefill's are
    (B, T, C)."""

    def __init__(self, prompts: list[list[int]], new_tokens: int, at: int = 3):
        self.prompts, self.new_tokens, self.at = prompts, new_tokens, at
        self.engine: Engine | None = None
        self.jobs: list = []
        self.arrived_in_step: int | None = None  # the decode call count at the submission
        self._armed = threading.Event()
        self._calls = 0

    def arm(self) -> None:
        self._armed.set()

    def __call__(self, x, w, eps):
        if x.dim() == 2 and self._armed.is_set() and not self.jobs:
            self._calls += 1
            if self._calls == self.at:
                self.jobs = [self.engine.submit(p, self.new_tokens, stop_ids=()) for p in self.prompts]
                self.arrived_in_step = self._calls
        return rmsnorm_reference(x, w, eps)


def _serve_with_arrivals_inside_a_step(decoder: Decoder, streams: list[list[int]], arrivals: list[list[int]],
                                       new_tokens: int, stream_tokens: int = 12):
    """Rows decode ``streams``; ``arrivals`` come in inside one of their steps. (engine, stream jobs, arrival jobs)"""
    hook = _ArrivalsInsideAStep(arrivals, new_tokens)
    e = Engine(decoder, None, SHAPES, max_waiting=8, batch_buckets=(1, 2, 4))
    hook.engine = e
    e.switch_operator("rmsnorm", hook, "plugin:arrivals")
    started = [threading.Event() for _ in streams]
    jobs = [e.submit(p, stream_tokens, stop_ids=(), on_token=lambda _, ev=ev: ev.set()) for p, ev in zip(streams, started)]
    for ev in started:
        assert ev.wait(30)
    hook.arm()
    deadline = time.monotonic() + 30
    while not hook.jobs and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hook.jobs, "the arrivals were never submitted (no decode step ran after arm())"
    for j in jobs + hook.jobs:
        assert j.done.wait(60) and j.error is None, j.error
    return e, jobs, hook.jobs


@pytest.fixture(scope="module")
def tiny():
    return load_model("preset:tiny", seed=5)


def test_a_prompt_arriving_inside_a_decode_step_is_prefilled_there_and_gets_the_tokens_it_gets_alone(tiny):
    streams = [list(range(20, 41))]
    arrivals = [[7, 8, 9, 10, 11], list(range(100, 133)), [60]]  # lengths 5, 33 (over a 32 bucket), 1
    alone = [Generator(tiny.decoder(), SHAPES).generate(p, 12)[0] for p in streams + arrivals]
    e, jobs, arrived = _serve_with_arrivals_inside_a_step(tiny.decoder(), streams, arrivals, 12)
    try:
        assert e.prefill_mid_step, "a CPU engine without CUDA graphs prefills inside decode steps by default"
        assert e.prompts_prefilled_in_step == len(arrivals)  # 3 of 4 rows were free: all three went in at once
        assert [j.tokens for j in jobs + arrived] == alone
    finally:
        e.close()


def test_a_prompt_that_ends_at_its_first_token_frees_its_row(tiny):
    e, _, arrived = _serve_with_arrivals_inside_a_step(tiny.decoder(), [[3, 4, 5]], [[7, 8, 9]], 1)
    try:
        assert e.prompts_prefilled_in_step == 1
        assert len(arrived[0].tokens) == 1 and arrived[0].finish_reason == "length"
        # its prefill called the prefill's operators (a plugin on probation among them counts this request)
        assert ("attention_prefill", "reference") in arrived[0].stats.ops_called
        assert not any(op == "attention_decode" for op, _ in arrived[0].stats.ops_called)  # and no decode step
        deadline = time.monotonic() + 10
        while e._free_rows() < 4 and time.monotonic() < deadline:  # the stream's row ends with its request too
            time.sleep(0.01)
        assert e._free_rows() == 4
    finally:
        e.close()


def test_the_ring_layers_of_a_sliding_window_model_are_copied_right(tiny):
    """tiny-gemma3 has a 4-token window on two of its three layers: a 9-token prompt wraps its ring. Its post-norms
    are scaled up so attention decides the tokens (with the preset's random weights the embedding outweighs every
    block and greedy decoding would repeat the last token whatever the cache held)."""
    gemma = load_model("preset:tiny-gemma3", seed=5)
    blocks = [dataclasses.replace(b, post_attn_norm=16 * b.post_attn_norm, post_ffn_norm=16 * b.post_ffn_norm)
              for b in gemma.weights.blocks]
    decoder = Decoder(gemma.config, dataclasses.replace(gemma.weights, blocks=blocks))
    streams, arrivals = [[3, 4, 5]], [list(range(30, 39)), [11, 12]]
    alone = [Generator(decoder, SHAPES).generate(p, 10)[0] for p in streams + arrivals]
    assert len({tuple(t) for t in alone}) == 3 and all(len(set(t)) > 2 for t in alone)  # attention matters
    e, jobs, arrived = _serve_with_arrivals_inside_a_step(decoder, streams, arrivals, 10, stream_tokens=10)
    try:
        assert e.prompts_prefilled_in_step == 2
        assert [j.tokens for j in jobs + arrived] == alone
    finally:
        e.close()


def test_switched_off_the_same_arrivals_wait_for_the_steps_end(tiny):
    """The control: without it the arrival is prefilled between steps, as before (and the tokens are the same)."""
    hook = _ArrivalsInsideAStep([[7, 8, 9]], 6)
    e = Engine(tiny.decoder(), None, SHAPES, max_waiting=8, batch_buckets=(1, 2, 4), prefill_mid_step=False)
    hook.engine = e
    try:
        e.switch_operator("rmsnorm", hook, "plugin:arrivals")
        first = threading.Event()
        stream = e.submit([3, 4, 5], 6, stop_ids=(), on_token=lambda _: first.set())
        assert first.wait(30)
        hook.arm()
        deadline = time.monotonic() + 30
        while not hook.jobs and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hook.jobs and hook.jobs[0].done.wait(30) and stream.done.wait(30)
        assert e.prompts_prefilled_in_step == 0
        assert hook.jobs[0].tokens == Generator(tiny.decoder(), SHAPES).generate([7, 8, 9], 6)[0]
    finally:
        e.close()
