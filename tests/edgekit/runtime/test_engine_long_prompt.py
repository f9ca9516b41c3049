"""#32 row 2: one long prompt with max_tokens 1 while others stream.

Before: the whole prompt was prefilled on the device thread in one piece, and every stream and every new request
stalled for as long (~70 s for 2046 tokens of the default model on a CPU). Now a prompt longer than a chunk is
prefilled a slice at a time between decode steps, each slice sized so that it and the decode step after it fit one
chunk's time: no stream pauses for longer than one chunk."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from edgekit.errors import ShapeError
from edgekit.generate import Generator
from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.model.decoder import Decoder
from edgekit.model.loader import load_model
from edgekit.runtime.engine import Engine
from edgekit.runtime.prefill_slicing import MIN_SLICE_TOKENS, PROMPT_SHARE
from edgekit.shapes import StaticShapes

pytestmark = pytest.mark.serial  # it times wall-clock behaviour: scripts/test.sh runs it alone, after the parallel phase

SHAPES = StaticShapes(buckets=(16, 32, 512), max_seq_len=576)
PER_TOKEN_S = 1e-3  # the slowed rmsnorm's cost per row-token: a prefill's cost grows with its tokens, as on a CPU


@pytest.fixture(scope="module")
def model():
    return load_model("preset:tiny", seed=5)


def _costly(x, w, eps):
    time.sleep(PER_TOKEN_S * x[..., 0].numel())  # (B, T, C) or (B, C): B*T row-tokens
    return rmsnorm_reference(x, w, eps)


def _worst_pause_under_a_long_prompt(model) -> tuple[float, float, list[int]]:
    """The longest pause between two tokens of 4 streams while a 480-token prompt is prefilled, one chunk's time
    measured in the same engine (a 32-token prompt prefilled while nothing else runs), and the prompt's slices."""
    e = Engine(model.decoder(), None, SHAPES, max_waiting=4, batch_buckets=(1, 2, 4, 8), prefill_chunk_tokens=32)
    try:
        e.switch_operator("rmsnorm", _costly, "plugin:costly")
        one_chunk = e.submit(list(range(40, 72)), 1, stop_ids=())
        assert one_chunk.done.wait(30) and one_chunk.error is None
        chunk_s = e.prefill_units[-1][1]
        stamps: list[list[float]] = [[] for _ in range(4)]
        streams = [e.submit([3 + i, 4, 5], 200, stop_ids=(), on_token=lambda _, i=i: stamps[i].append(time.perf_counter()))
                   for i in range(4)]
        while min(len(s) for s in stamps) < 5:  # all four are streaming
            time.sleep(0.01)
        units_before = len(e.prefill_units)
        t_arrive = time.perf_counter()
        long_prompt = e.submit(list(range(6, 486)), 1, stop_ids=())  # 480 tokens, one new token
        assert long_prompt.done.wait(60) and long_prompt.error is None
        t_done = time.perf_counter()
        for j in streams:
            j.cancel()
            j.done.wait(60)
        slices = [n for n, _ in list(e.prefill_units)[units_before:]]
        gaps = [b - a for s in stamps for a, b in zip(s, s[1:]) if b >= t_arrive and a <= t_done]
        return max(gaps), chunk_s, slices
    finally:
        e.close()


def test_a_long_prompt_arriving_during_4_streams_pauses_none_longer_than_one_chunks_time(model):
    """Slices of a fixed 32 tokens failed this: a stream then waited for a whole chunk *and* its own decode step (the
    sleeps alone make that 36/32 of a chunk, every time). The worst pause is ~0.75 of a chunk on the 2-core machine;
    once in five runs under other load one pause took 1.34 (a single stall of the engine thread), so a second
    measurement is taken before failing: a slicing defect fails both."""
    for attempt in range(2):
        worst_s, chunk_s, slices = _worst_pause_under_a_long_prompt(model)
        assert sum(slices) == 480 and len(slices) > 480 // 32, slices  # in slices smaller than a chunk
        if worst_s <= 1.1 * chunk_s:
            break
    assert worst_s <= 1.1 * chunk_s, (f"a stream paused {worst_s:.3f} s in both tries; one chunk takes "
                                      f"{chunk_s:.3f} s; slices {slices}")


FIXED_S = 20e-3  # a slowed rmsnorm call's own cost: 5 calls make a forward's fixed cost, as a CPU's is


def _fixed_and_costly(x, w, eps):
    time.sleep(FIXED_S + PER_TOKEN_S * x[..., 0].numel())
    return rmsnorm_reference(x, w, eps)


def test_a_long_prompt_under_turns_slower_than_its_slices_comes_in_before_its_time_limit(model):
    """Forwards whose fixed cost is most of a chunk's time (as on the 2-core CPU) and a decode step of 4 rows that
    leaves no room for a slice's fixed cost in the chunk's time: slicing for the streams alone shrank every slice to
    the 4-token floor, paid the fixed cost 120 times (~29 s) and the request reached its 12 s time limit with its
    first token (2046 tokens of the default model under 4 streams took up to 301 s against serve's 300 s). The
    prompt is due within PROMPT_SHARE of its limit: slices grow to the pace that meets that."""
    limit_s = 12.0
    e = Engine(model.decoder(), None, SHAPES, max_waiting=4, batch_buckets=(1, 2, 4, 8), prefill_chunk_tokens=32,
               max_request_s=limit_s)
    try:
        e.switch_operator("rmsnorm", _fixed_and_costly, "plugin:costly")
        for n in (32, 32, 8, 32, 8):  # the cost line: a warm-up, then two lengths
            alone = e.submit(list(range(40, 40 + n)), 1, stop_ids=())
            assert alone.done.wait(30) and alone.error is None
        streams = [e.submit([3 + i, 4, 5], 500, stop_ids=()) for i in range(4)]
        while not all(len(s.tokens) >= 3 for s in streams):  # all four are decoding
            time.sleep(0.01)
        units_before = len(e.prefill_units)
        t_arrive = time.monotonic()
        long_prompt = e.submit(list(range(6, 486)), 1, stop_ids=())  # 480 tokens, one new token
        assert long_prompt.done.wait(60) and long_prompt.error is None
        took_s = time.monotonic() - t_arrive
        decoding = all(s.finish_reason is None for s in streams)
        for j in streams:
            j.cancel()
            j.done.wait(60)
        slices = [n for n, _ in list(e.prefill_units)[units_before:]]
        assert long_prompt.finish_reason == "length" and len(long_prompt.tokens) == 1, long_prompt.finish_reason
        assert took_s <= 1.25 * PROMPT_SHARE * limit_s, (took_s, slices)
        assert decoding and sum(slices) == 480, slices  # the streams decoded throughout: every slice was paced
        assert max(slices) > MIN_SLICE_TOKENS, slices
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
        assert sum(1 for n, _ in e.prefill_units if n <= 8) >= 38 // 8 + 31 // 8
    finally:
        e.close()


def test_a_prompt_past_the_largest_bucket_is_served_in_chunks_of_that_bucket():
    """A server built with buckets shorter than its KV cache refused such prompts (413) while `edgekit run` took them
    in chunks. Now the engine takes them in pieces of at most the largest bucket (the memory plan sizes a prefill for
    it) with chunking off (graphed runners), in chunks of 8, and with the CPU's default chunk of 128, and answers
    what one whole prefill answers; only the KV cache bounds a prompt. The model's answer depends on the first
    chunk's tokens (a chunk that forgot the positions before it would change it)."""
    cfg, weights = _gemma3_attending()
    shapes, whole_shapes = StaticShapes(buckets=(16, 32), max_seq_len=96), StaticShapes(buckets=(96,), max_seq_len=96)
    prompt = list(range(20, 90))  # 70 tokens: past the largest bucket
    whole = Generator(Decoder(cfg, weights), whole_shapes).generate(prompt, 8)[0]
    other_start = Generator(Decoder(cfg, weights), whole_shapes).generate(list(range(120, 152)) + prompt[32:], 8)[0]
    assert whole != other_start  # the answer reads the first chunk
    for chunk in (0, 8, None):  # 0: no chunking for fairness (graphed runners' default); None: the engine's default
        e = Engine(Decoder(cfg, weights), None, shapes, max_waiting=4, prefill_chunk_tokens=chunk)
        try:
            job = e.submit(prompt, 8, stop_ids=())
            assert job.done.wait(60) and job.error is None, job.error
            assert job.tokens == whole, chunk
            assert job.stats.prefill_chunks == len(e.prefill_units)
            slices = [n for n, _ in e.prefill_units]
            assert sum(slices) == 70 and max(slices) <= (chunk or 32), (chunk, slices)
            if chunk != 8:
                assert slices == [32, 32, 6], (chunk, slices)  # nothing else runs: chunks of the largest bucket
            with pytest.raises(ShapeError, match=r"at most 88 fit \(the KV cache holds 96 tokens"):
                e.submit(list(range(1, 90)), 8, stop_ids=())  # 89 + 8 > 96
        finally:
            e.close()


@pytest.mark.parametrize("graph_like", [False, True], ids=["eager", "graph-like"])
def test_without_chunking_a_short_prompt_does_not_wait_for_every_chunk_of_a_long_one(model, graph_like):
    """With chunking off only a prompt past every bucket goes in pieces, one a turn; the prompts behind it are
    prefilled in the turns between, not after its last piece. ``graph-like``: the runner declares what a CUDA-graphed
    one does (a prompt padded to its bucket, one prompt a forward), the engine path a GPU server takes."""
    e = Engine(model.decoder(), None, StaticShapes(buckets=(16, 32), max_seq_len=96), max_waiting=4,
               prefill_chunk_tokens=0, prefill_mid_step=False)
    if graph_like:
        e._runner.batched_prefill, e._runner.static_prefill_shapes = False, True
    try:
        long_job = e.submit(list(range(20, 90)), 4, stop_ids=())
        short_job = e.submit([3, 4, 5], 4, stop_ids=())
        for j in (long_job, short_job):
            assert j.done.wait(60) and j.error is None, j.error
        slices = [n for n, _ in e.prefill_units]
        assert sorted(slices) == [3, 6, 32, 32] and slices[-1] == 6, slices  # the short prompt went before the end
    finally:
        e.close()


def _gemma3_attending():
    """tiny-gemma3 whose blocks' post-norms are scaled 16x: with its random weights the embedding (scaled by 8)
    outweighs every block's output and greedy decoding repeats the prompt's last token whatever attention reads."""
    gemma = load_model("preset:tiny-gemma3", seed=5)
    blocks = [dataclasses.replace(b, post_attn_norm=16 * b.post_attn_norm, post_ffn_norm=16 * b.post_ffn_norm)
              for b in gemma.weights.blocks]
    return gemma.config, dataclasses.replace(gemma.weights, blocks=blocks)


def test_a_gemma3_prompt_in_chunks_past_its_sliding_window_gets_the_greedy_tokens_of_an_unchunked_server():
    """tiny-gemma3's local layers keep a ring of 4 rows: a chunk of 8 wraps it, and the next chunk's queries must
    still see the 3 positions before them that the ring holds (a parked decode step writes the row's next position,
    in the ring too). Chunked serving answers what a server prefilling whole prompts answers."""
    cfg, weights = _gemma3_attending()
    assert cfg.kv_rows(0, SHAPES.max_seq_len) == 4 and cfg.kv_rows(2, SHAPES.max_seq_len) == SHAPES.max_seq_len
    prompts = [list(range(20, 58)), [3, 4, 5], list(range(100, 131)), list(range(200, 209))]
    answers = {}
    for chunk in (0, 8):  # 0: whole prompts
        e = Engine(Decoder(cfg, weights), None, SHAPES, max_waiting=4, prefill_chunk_tokens=chunk)
        try:
            jobs = [e.submit(p, 12, stop_ids=()) for p in prompts]
            for j in jobs:
                assert j.done.wait(60) and j.error is None, j.error
            answers[chunk] = [j.tokens for j in jobs]
            if chunk:
                assert sum(1 for n, _ in e.prefill_units if n <= 8) >= 38 // 8 + 31 // 8 + 1
        finally:
            e.close()
    assert answers[8] == answers[0]
    assert answers[0] == [Generator(Decoder(cfg, weights), SHAPES).generate(p, 12)[0] for p in prompts]
    assert len({t for a in answers[0] for t in a}) > 8  # the answers depend on what attention reads
