"""Engine semantics: swaps switch between steps; requests that wait together decode together (and give the same
tokens as alone); admission is bounded in count and in waiting time."""

from __future__ import annotations

import threading
import time

import pytest

from edgekit.generate import Generator, SamplingConfig
from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.model.loader import load_model
from edgekit.runtime.engine import Engine, OverloadedError
from edgekit.shapes import StaticShapes

SHAPES = StaticShapes(buckets=(16, 32), max_seq_len=64)


@pytest.fixture(scope="module")
def model():
    return load_model("preset:tiny", seed=5)


@pytest.fixture()
def engine(model):
    e = Engine(model.decoder(), None, SHAPES, max_waiting=4)
    yield e
    e.close()


def test_a_swap_lands_between_steps_never_inside_one(engine):
    calls = {"old": 0, "new": 0}
    inside, release = threading.Event(), threading.Event()

    def old(x, w, eps):
        calls["old"] += 1
        inside.set()
        release.wait(5)
        return rmsnorm_reference(x, w, eps)

    def new(x, w, eps):
        calls["new"] += 1
        return rmsnorm_reference(x, w, eps)

    engine.switch_operator("rmsnorm", old, "plugin:1")
    job = engine.submit([3, 4, 5], 6)
    assert inside.wait(5)  # the prefill step is inside the old kernel
    engine.switch_operator("rmsnorm", new, "plugin:2")
    assert calls["new"] == 0  # the step in flight is not touched
    release.set()
    assert job.done.wait(10) and job.error is None
    assert calls["new"] > 0  # later steps of the same request run the new kernel
    assert engine.table.sources()["rmsnorm"] == "plugin:2" and len(engine.swap_pauses_s) >= 2
    assert max(engine.swap_pauses_s) < 0.05


def test_requests_waiting_together_decode_together_with_the_tokens_they_get_alone(engine, model):
    prompts = [[3, 4, 5], [7, 8, 9, 10, 11], [1], list(range(20, 38))]
    alone = [Generator(model.decoder(), SHAPES).generate(p, 8)[0] for p in prompts]
    gate = threading.Event()

    def gated(x, w, eps):  # holds the first prefill until every request has queued
        gate.wait(5)
        return rmsnorm_reference(x, w, eps)

    engine.switch_operator("rmsnorm", gated, "plugin:gate")
    jobs = [engine.submit(p, 8) for p in prompts]  # all four wait while the first prefill is held
    gate.set()
    for j in jobs:
        assert j.done.wait(20) and j.error is None
    assert [j.tokens for j in jobs] == alone
    assert engine.step_batches[4] > 0  # the four rows shared decode steps


def test_sampling_rows_keep_their_own_seed_in_a_batch(engine, model):
    s = SamplingConfig(temperature=1.0, top_k=50, seed=7, top_p=0.9)
    alone = Generator(model.decoder(), SHAPES).generate([5, 9], 8, sampling=s)[0]
    jobs = [engine.submit([5, 9], 8, s), engine.submit([1, 2, 3], 8, SamplingConfig())]
    for j in jobs:
        assert j.done.wait(20)
    assert jobs[0].tokens == alone


@pytest.mark.serial  # times a refusal / a parse: run alone (scripts/test.sh)
def test_a_full_queue_refuses_at_once(model):
    e = Engine(model.decoder(), None, SHAPES, max_waiting=0, batch_buckets=(1,))
    hold = threading.Event()
    try:
        e.switch_operator("rmsnorm", lambda x, w, eps: (hold.wait(5), rmsnorm_reference(x, w, eps))[1], "plugin:slow")
        first = e.submit([1, 2], 2)  # takes the only row
        time.sleep(0.2)
        t = time.perf_counter()
        with pytest.raises(OverloadedError, match="capacity"):
            e.submit([1, 2], 2)
        assert time.perf_counter() - t < 0.1
        hold.set()
        assert first.done.wait(10) and first.error is None
    finally:
        hold.set()
        e.close()


def test_a_request_that_waits_too_long_is_refused_not_left_hanging(model):
    e = Engine(model.decoder(), None, SHAPES, max_waiting=2, batch_buckets=(1,), max_queue_wait_s=0.2)
    hold = threading.Event()
    try:
        e.switch_operator("rmsnorm", lambda x, w, eps: (hold.wait(1.0), rmsnorm_reference(x, w, eps))[1], "plugin:slow")
        first = e.submit([1, 2], 2)
        waiting = e.submit([1, 2], 2)
        assert waiting.done.wait(10)
        assert isinstance(waiting.error, OverloadedError) and "waited" in str(waiting.error)
        hold.set()
        assert first.done.wait(10)
    finally:
        hold.set()
        e.close()


def test_a_cancelled_request_frees_its_row(engine):
    job = engine.submit([1, 2, 3], 40)
    job.cancel()
    assert job.done.wait(10) and job.finish_reason == "cancelled" and len(job.tokens) < 40
    assert engine.active_rows() == 0


def test_switch_back_to_reference(engine):
    engine.switch_operator("rmsnorm", lambda x, w, eps: rmsnorm_reference(x, w, eps), "plugin:1")
    engine.switch_operator("rmsnorm", None, "reference")
    assert engine.table.sources()["rmsnorm"] == "reference"


def test_a_waiter_with_a_free_row_is_not_refused_during_a_long_step(model):
    e = Engine(model.decoder(), None, SHAPES, max_waiting=2, batch_buckets=(1, 2), max_queue_wait_s=0.2)
    hold = threading.Event()
    try:
        e.switch_operator("rmsnorm", lambda x, w, eps: (hold.wait(0.3), rmsnorm_reference(x, w, eps))[1], "plugin:slow")
        first = e.submit([1, 2], 2)  # the device thread is inside its (slow) prefill
        time.sleep(0.05)
        second = e.submit([3, 4], 2)  # row 1 is free: it only waits for the step to end
        assert second.done.wait(30) and first.done.wait(30)
        assert second.error is None and first.error is None
    finally:
        hold.set()
        e.close()


def test_a_group_is_queued_whole_or_refused_whole(model):
    """OpenAI's n: the choices of one request get rows together or a 429 together, never half a group."""
    e = Engine(model.decoder(), None, SHAPES, max_waiting=0, batch_buckets=(1, 2, 4))
    hold = threading.Event()
    try:
        e.switch_operator("rmsnorm", lambda x, w, eps: (hold.wait(5), rmsnorm_reference(x, w, eps))[1], "plugin:slow")
        first = e.submit_group([1, 2], 2, [SamplingConfig()] * 2)  # two rows busy: room for two more, no waiter
        time.sleep(0.2)
        with pytest.raises(OverloadedError, match="3 sequences"):  # 3 fit the 4 rows, but not the 2 free now
            e.submit_group([3, 4], 2, [SamplingConfig()] * 3)
        assert e.queue_depth() == 0  # nothing of the refused group stayed behind
        group = e.submit_group([3, 4], 2, [SamplingConfig(temperature=1.0, seed=s) for s in (1, 2)])
        hold.set()
        for job in [*first, *group]:
            assert job.done.wait(10) and job.error is None and len(job.tokens) == 2
    finally:
        hold.set()
        e.close()


def test_group_tokens_say_which_sequence_they_belong_to(engine):
    seen: list[tuple[int, int]] = []
    jobs = engine.submit_group([5, 6, 7], 4, [SamplingConfig(temperature=1.0, seed=s) for s in (3, 4)],
                               stop_ids=(), on_token=lambda i, tok: seen.append((i, tok)))
    for j in jobs:
        assert j.done.wait(10) and j.error is None
    assert [t for i, t in seen if i == 0] == jobs[0].tokens and [t for i, t in seen if i == 1] == jobs[1].tokens


def test_the_runner_switched_away_from_is_freed_off_the_device_thread(engine):
    """Freeing a runner (on a GPU: its CUDA graphs and their memory) inside the hand-over would lengthen the swap
    pause: the device thread only parks it, and the next switch_operator frees it on its caller's thread."""
    import weakref

    first = weakref.ref(engine._runner)
    engine.switch_operator("rmsnorm", lambda x, w, eps: rmsnorm_reference(x, w, eps), "plugin:a")
    assert engine.submit([1, 2], 2).done.wait(10)  # a step: the device thread has switched
    assert first() is not None and first() in engine._retired  # parked, not freed, by the device thread
    engine.switch_operator("rmsnorm", lambda x, w, eps: rmsnorm_reference(x, w, eps), "plugin:b")
    assert first() is None  # freed by the caller of the next switch


def test_a_step_with_non_finite_logits_fails_its_request_instead_of_answering_garbage(engine):
    """The argmax of NaN logits is some token: emitted, a numeric fault would pass as an answer. The request ends with
    a NumericFaultError at the faulty step, the fault is reported, and the freed row serves the next request."""
    import torch

    from edgekit.errors import NumericFaultError

    poisoned = {"on": False}

    def rmsnorm(x, w, eps):
        out = rmsnorm_reference(x, w, eps)
        return torch.full_like(out, float("nan")) if poisoned["on"] else out

    engine.switch_operator("rmsnorm", rmsnorm, "test:nan-once-poisoned")
    faults = []
    engine.on_nonfinite = lambda: faults.append(1)
    job = engine.submit([3, 4, 5], 8, stop_ids=(), on_token=lambda tok: poisoned.update(on=True))
    assert job.done.wait(30)
    assert isinstance(job.error, NumericFaultError) and "position 3" in str(job.error), job.error
    assert len(job.tokens) == 1 and job.finish_reason == "error" and faults  # the prefill's token, then the fault
    poisoned["on"] = False
    again = engine.submit([3, 4, 5], 8, stop_ids=())
    assert again.done.wait(30) and again.error is None and len(again.tokens) == 8


def test_a_prefill_with_non_finite_logits_fails_its_request(engine):
    import torch

    from edgekit.errors import NumericFaultError

    engine.switch_operator("rmsnorm", lambda x, w, eps: torch.full_like(x, float("nan")), "test:nan")
    faults = []
    engine.on_nonfinite = lambda: faults.append(1)
    job = engine.submit([3, 4, 5], 8, stop_ids=())
    assert job.done.wait(30)
    assert isinstance(job.error, NumericFaultError) and "prefill of 3 prompt tokens" in str(job.error), job.error
    assert job.tokens == [] and faults


def test_a_sliding_window_model_serves_batched_requests_with_the_tokens_they_get_alone():
    """Gemma 3's ring caches on the server path: each request's prompt is prefilled alone into its row of the shared
    cache (a bucket longer than the window of 4: the ring keeps the prompt's own last positions, not the padding),
    then the rows decode together past the window."""
    import torch

    model = load_model("preset:tiny-gemma3", seed=2)
    g = torch.Generator().manual_seed(0)
    # the preset's random weights make every step repeat its input token (the scaled embedding dominates the tied
    # head): wider norms and projections make the tokens depend on what the cache holds
    model.weights.norm.copy_(torch.randn(model.weights.norm.shape, generator=g) * 3)
    for b in model.weights.blocks:
        for t in b.norms().values():
            t.add_(torch.randn(t.shape, generator=g) * 3)
        for lw in b.linears().values():
            lw.weight.mul_(10)
    prompts = [list(range(30, 43)), [7, 8, 9, 10, 11], [1, 2], list(range(60, 77))]
    alone = [Generator(model.decoder(), SHAPES).generate(p, 10)[0] for p in prompts]
    e = Engine(model.decoder(), None, SHAPES, max_waiting=4)
    try:
        jobs = [e.submit(p, 10) for p in prompts]
        for j in jobs:
            assert j.done.wait(30) and j.error is None
        assert [j.tokens for j in jobs] == alone
        assert sum(len(set(t)) for t in alone) > len(alone) + 4  # not each request repeating one token
    finally:
        e.close()


def test_more_choices_than_rows_is_a_request_error_not_an_endless_429(model):
    from edgekit.runtime.engine import RequestTooLargeError

    e = Engine(model.decoder(), None, SHAPES, max_waiting=4, batch_buckets=(1,))
    try:
        with pytest.raises(RequestTooLargeError, match="n=2 .* at most 1"):
            e.submit_group([1, 2], 2, [SamplingConfig(), SamplingConfig()])
    finally:
        e.close()


def _slow_norm(x, w, eps):
    time.sleep(0.004)  # a step of several ms: the expected wait behind 30 tokens is far over 0.05 s
    return rmsnorm_reference(x, w, eps)


@pytest.mark.parametrize("admission_s, admitted", [(None, False), (30.0, True)])
def test_a_raised_admission_wait_lets_a_batch_1_engine_queue_a_request(model, admission_s, admitted):
    e = Engine(model.decoder(), None, SHAPES, max_waiting=2, batch_buckets=(1,), max_queue_wait_s=30.0,
               max_admission_wait_s=admission_s)
    try:
        e.switch_operator("rmsnorm", _slow_norm, "plugin:slow")
        assert e.complete([1, 2], 3).token_ids  # the engine measures its step
        first = e.submit([1, 2], 30)
        while not first.tokens:  # answering: the only row is taken
            time.sleep(0.005)
        if admitted:  # two in line behind the one answering: each waits for the row after the one before it
            queued = [e.submit([3, 4], 2), e.submit([5, 6], 2)]
            for job in queued:
                assert job.done.wait(30) and job.error is None and len(job.tokens) == 2
        else:
            with pytest.raises(OverloadedError, match="expected to free"):
                e.submit([3, 4], 2)
        assert first.done.wait(30) and first.error is None
    finally:
        e.close()
