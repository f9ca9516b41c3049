"""Pipelined greedy decode (one step of lookahead): the same tokens as the synchronous engine, whatever finishes,
stops, is cancelled, samples or is swapped while a step is in flight. On the CPU the eager runner feeds its picks
back exactly as a graph does on a GPU (``lookahead=True``); tests/edgekit/runtime/test_engine_gpu.py runs it graphed."""

from __future__ import annotations

import threading
import time

import pytest

from edgekit.generate import Generator, SamplingConfig
from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.model.loader import load_model
from edgekit.runtime.engine import Engine
from edgekit.shapes import StaticShapes

SHAPES = StaticShapes(buckets=(16, 32), max_seq_len=64)
PROMPTS = [[3, 4, 5], [7, 8, 9, 10, 11], [1], list(range(20, 38))]
LENGTHS = [12, 5, 9, 14]


@pytest.fixture(scope="module")
def model():
    return load_model("preset:tiny", seed=5)


def _engine(model, lookahead: bool) -> Engine:
    e = Engine(model.decoder(), None, SHAPES, max_waiting=8, lookahead=lookahead)
    fed_back = []
    launch = e._runner.launch

    def counting(batch, tokens=None, *args):  # how many steps ran from the device's own picks
        fed_back.append(tokens is None)
        return launch(batch, tokens, *args)

    e._runner.launch = counting
    e.fed_back = fed_back
    # every (token, position) an active row is fed: the preset's random weights make tokens depend little on
    # positions, so the tokens alone would not show a step fed at a wrong position
    e.fed = []
    runner = e._runner  # the first runner: a swap's new runner is not spied on
    decode = runner.step_decoder.decode

    def spying(tokens, positions, cache):
        active = runner._inputs[len(tokens)][2]
        e.fed += [(int(t), int(p)) for t, p, a in zip(tokens, positions, active) if a]
        return decode(tokens, positions, cache)

    e._runner.step_decoder = type("Spy", (), {"decode": staticmethod(spying)})()
    e.jobs = []
    return e


def _fed_right(e: Engine) -> bool:
    """Each row was fed its own tokens at their positions (the lookahead feeds the last one once more)."""
    valid = {(tok, len(j.prompt_ids) + k) for j in e.jobs for k, tok in enumerate(j.tokens)}
    return set(e.fed) <= valid


def _staggered(e: Engine, stop_ids=()) -> list:
    """Half the requests first, the rest while those decode: rows join and leave between steps."""
    jobs = [e.submit(p, n, stop_ids=stop_ids) for p, n in zip(PROMPTS[:2], LENGTHS[:2])]
    while not jobs[0].tokens:
        time.sleep(0.001)
    jobs += [e.submit(p, n, stop_ids=stop_ids) for p, n in zip(PROMPTS[2:], LENGTHS[2:])]
    if hasattr(e, "jobs"):
        e.jobs += jobs
    for j in jobs:
        assert j.done.wait(30) and j.error is None, j.error
    return [(j.tokens, j.finish_reason) for j in jobs]


def test_lookahead_gives_the_tokens_each_request_gets_alone(model):
    alone = [(Generator(model.decoder(), SHAPES).generate(p, n)[0], "length") for p, n in zip(PROMPTS, LENGTHS)]
    e = _engine(model, lookahead=True)
    try:
        assert _staggered(e) == alone  # exactly max_tokens each: every lookahead past the end was dropped
        assert sum(e.fed_back) > 0  # steps really ran from the device's picks
        assert e.fed and _fed_right(e)
    finally:
        e.close()


def test_a_stop_token_ends_a_row_and_its_lookahead_token_is_dropped(model):
    sync = Engine(model.decoder(), None, SHAPES, max_waiting=8, lookahead=False)
    try:
        free = _staggered(sync)
        stop = free[0][0][3]  # a token the first request emits mid-way
        want = _staggered(sync, stop_ids=(stop,))
    finally:
        sync.close()
    assert want[0][1] == "stop" and want[0][0][-1] == stop
    e = _engine(model, lookahead=True)
    try:
        assert _staggered(e, stop_ids=(stop,)) == want
        assert e.fed and _fed_right(e)
    finally:
        e.close()


def test_sampled_rows_run_on_a_drained_pipeline_with_their_own_seed(model):
    samplings = [SamplingConfig(temperature=0.9, top_k=20, seed=11), SamplingConfig()]
    got = {}
    for lookahead in (False, True):
        e = _engine(model, lookahead)
        try:
            jobs = [e.submit(PROMPTS[0], 10, s, stop_ids=()) for s in samplings]
            for j in jobs:
                assert j.done.wait(30) and j.error is None
            got[lookahead] = [j.tokens for j in jobs]
            if lookahead:
                assert not any(e.fed_back)  # a sampled row in the batch: every step read back before the next
        finally:
            e.close()
    assert got[True] == got[False]


def test_a_cancel_while_a_step_is_in_flight_frees_the_row(model):
    e = _engine(model, lookahead=True)
    try:
        job = e.submit(PROMPTS[1], 40, stop_ids=())
        while len(job.tokens) < 3:
            time.sleep(0.001)
        job.cancel()
        assert job.done.wait(10) and job.finish_reason == "cancelled"
        after = e.submit(PROMPTS[0], LENGTHS[0], stop_ids=())  # the freed row serves the next request
        assert after.done.wait(30) and after.tokens == Generator(model.decoder(), SHAPES).generate(PROMPTS[0], LENGTHS[0])[0]
    finally:
        e.close()


def test_swaps_while_steps_are_in_flight_keep_the_tokens(model):
    e = _engine(model, lookahead=True)
    try:
        want = [j.tokens for j in [e.submit(p, 30, stop_ids=()) for p in PROMPTS] if j.done.wait(30)]
        jobs = [e.submit(p, 30, stop_ids=()) for p in PROMPTS]
        e.jobs, e.fed = jobs, []
        swapper = threading.Thread(target=lambda: [e.switch_operator("rmsnorm", lambda x, w, eps: rmsnorm_reference(x, w, eps),
                                                                     f"plugin:{i}") for i in range(4)])
        swapper.start()
        swapper.join(60)
        for j in jobs:
            assert j.done.wait(30) and j.error is None, j.error
        assert [j.tokens for j in jobs] == want and _fed_right(e)  # the steps before the first swap
        assert e.table.sources()["rmsnorm"] == "plugin:3"
    finally:
        e.close()


def test_a_step_that_fails_with_a_lookahead_in_flight_fails_its_requests_and_the_next_ones_are_served(model):
    e = _engine(model, lookahead=True)
    try:
        seen = []
        boom = e.submit(PROMPTS[0], 20, stop_ids=(), on_token=lambda tok: seen.append(tok) or 1 / (len(seen) < 5))
        assert boom.done.wait(30) and boom.finish_reason == "error" and "ZeroDivisionError" in str(boom.error)
        assert any(e.fed_back)  # it failed while a fed-back step was in flight
        after = e.submit(PROMPTS[1], LENGTHS[1], stop_ids=())
        assert after.done.wait(30) and after.error is None
        assert after.tokens == Generator(model.decoder(), SHAPES).generate(PROMPTS[1], LENGTHS[1])[0]
    finally:
        e.close()
