"""The serving engine on a GPU: CUDA-graph prefill/decode buckets give the eager engine's tokens, and a swap
captured on another thread while requests decode lands between steps without changing them."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.model.loader import load_model
from edgekit.runtime.engine import Engine
from edgekit.shapes import StaticShapes

pytestmark = pytest.mark.gpu
SHAPES = StaticShapes(buckets=(16, 32), max_seq_len=96)
PROMPTS = [[3, 4, 5], [7, 8, 9, 10, 11], [1], list(range(20, 38))]


@pytest.fixture(scope="module")
def decoder():
    # FP32: batch compositions differ between runs, and FP32 keeps their GEMMs' rounding out of the argmax
    return load_model("preset:tiny", seed=5).decoder(device="cuda", dtype=torch.float32)


def _run(engine: Engine, n: int = 24) -> list[list[int]]:
    jobs = [engine.submit(p, n, stop_ids=()) for p in PROMPTS]
    for j in jobs:
        assert j.done.wait(60) and j.error is None, j.error
    return [j.tokens for j in jobs]


def test_graphed_engine_matches_the_eager_one(decoder):
    eager = Engine(decoder, None, SHAPES, cuda_graphs=False)
    graphed = Engine(decoder, None, SHAPES, cuda_graphs=True)
    try:
        assert graphed.graphed and not eager.graphed
        assert _run(graphed) == _run(eager)
        assert graphed.step_batches[4] > 0
    finally:
        eager.close()
        graphed.close()


def test_swap_captured_while_decoding_lands_between_steps(decoder):
    e = Engine(decoder, None, SHAPES, cuda_graphs=True)
    try:
        want = _run(e, 64)
        jobs = [e.submit(p, 64, stop_ids=()) for p in PROMPTS]
        swapper = threading.Thread(target=lambda: [e.switch_operator("rmsnorm", lambda x, w, eps: rmsnorm_reference(x, w, eps), f"plugin:{i}")
                                                   for i in range(3)])
        swapper.start()
        swapper.join(120)
        for j in jobs:
            assert j.done.wait(60) and j.error is None, j.error
        assert [j.tokens for j in jobs] == want  # same math, so the same tokens across the switches
        assert e.table.sources()["rmsnorm"] == "plugin:2" and len(e.swap_pauses_s) >= 1
        assert max(e.swap_pauses_s) < 0.005
        torch.cuda.synchronize()
    finally:
        e.close()


def test_a_bundles_fused_plugins_serve_and_a_swap_falls_back_without_failing_a_request(tmp_path):
    """Issue 13: an h200 bundle ships the fused operators; the engine decodes on them (graphed), a swap of an
    operator they subsume under load falls back to the per-operator path, visibly, with 0 failed requests and
    hand-over pauses p99 <= 5 ms."""
    from gpu_bundles import tiny_h200_bundle

    from edgekit.graph.paths import fused_step_operators

    b = tiny_h200_bundle(tmp_path)
    e = Engine(b.decoder(), None, b.shapes, cuda_graphs=True)
    try:
        path = e.decode_path
        assert path.name == "fused", path.reason
        own = fused_step_operators(e.decoder.config, e.decoder.schemes)  # the Llama family's fused operators
        assert path.to_dict()["operator_sources"] == {op: "plugin:v1" for op in own}
        jobs = [e.submit(p, 48, stop_ids=()) for p in PROMPTS * 3]
        swiglu = e.table.get("swiglu")
        swaps = threading.Thread(target=lambda: [e.switch_operator("swiglu", swiglu, f"plugin:v{i}") for i in range(2, 6)])
        swaps.start()
        swaps.join(300)
        for j in jobs:
            assert j.done.wait(120) and j.error is None, j.error  # 0 failed requests
        after = e.decode_path
        assert after.name == "per-operator" and "swiglu" in after.reason
        pauses = sorted(e.swap_pauses_s)
        assert pauses and pauses[max(0, int(0.99 * len(pauses)) - 1)] <= 0.005, pauses
    finally:
        e.close()


def test_graphed_engine_decodes_on_the_path_run_takes(decoder):
    """serve's engine goes through select_decode_path as `edgekit run` does; a swap of an operator the fused kernels
    subsume moves it to the per-operator path (with the reason), and swapping the original back restores it."""
    from edgekit.runtime.fused_decode import select_decode_path

    run_path = select_decode_path(decoder, decoder.new_cache(1, SHAPES.max_seq_len))[1]
    e = Engine(decoder, None, SHAPES, cuda_graphs=True)
    try:
        assert e.decode_path.name == run_path.name, (e.decode_path, run_path)
        # what a request says its work called (a probation counts it by this): the graphed prefill's table entries
        # and the graphed step's, on the path it runs (the fused one calls no per-operator swiglu; its operators are
        # the table's entries by name, here "reference" ones that the JIT kernels stand in for)
        stats = e.complete([1, 2, 3], 4).stats
        assert stats.ops_called == e._runner.ops_called("prefill") | e._runner.ops_called("decode")
        assert ("attention_prefill", e.table.sources()["attention_prefill"]) in stats.ops_called
        decode_ops = {op for op, _ in e._runner.ops_called("decode")}
        assert ("swiglu" in decode_ops) == (run_path.name != "fused") and decode_ops <= set(e.table.sources())
        original, source = e.table.get("rmsnorm"), e.table.sources()["rmsnorm"]
        e.switch_operator("rmsnorm", lambda x, w, eps: rmsnorm_reference(x, w, eps), "plugin:test")
        assert e.submit([1, 2, 3], 4, stop_ids=()).done.wait(60)  # a step: the new runner is in use
        if run_path.name == "fused":
            assert e.decode_path.name == "per-operator" and "rmsnorm" in e.decode_path.reason
        e.switch_operator("rmsnorm", original, source)
        assert e.submit([1, 2, 3], 4, stop_ids=()).done.wait(60)
        assert e.decode_path.name == run_path.name
    finally:
        e.close()


def _staggered(engine: Engine, n: int, stop_ids=()) -> list:
    """Half the requests, then the rest while those decode: rows join and leave between steps."""
    jobs = [engine.submit(p, n + 7 * i, stop_ids=stop_ids) for i, p in enumerate(PROMPTS[:2])]
    while not jobs[0].tokens:
        time.sleep(0.001)
    jobs += [engine.submit(p, n - 5 * i, stop_ids=stop_ids) for i, p in enumerate(PROMPTS[2:])]
    for j in jobs:
        assert j.done.wait(60) and j.error is None, j.error
    return [(j.tokens, j.finish_reason) for j in jobs]


def test_pipelined_graphed_decode_gives_the_synchronous_tokens(decoder):
    """Issue 15: the graphed engine launches step t+1 from the device's own picks before reading step t; its tokens
    are the synchronous engine's, also with rows that stop, finish and join in between."""
    sync = Engine(decoder, None, SHAPES, cuda_graphs=True, lookahead=False)
    try:
        want = _staggered(sync, 40)
        stop = want[1][0][6]
        want_stop = _staggered(sync, 40, stop_ids=(stop,))
    finally:
        sync.close()
    e = Engine(decoder, None, SHAPES, cuda_graphs=True)
    assert e.lookahead  # the default on a GPU
    fed_back = []
    launch = e._runner.launch
    e._runner.launch = lambda b, tokens=None, *a: (fed_back.append(tokens is None), launch(b, tokens, *a))[1]
    try:
        assert _staggered(e, 40) == want
        assert _staggered(e, 40, stop_ids=(stop,)) == want_stop and want_stop[1][1] == "stop"
        assert sum(fed_back) > len(fed_back) / 2  # most steps ran from the device's picks
    finally:
        e.close()


def test_a_swap_recaptures_only_the_graphs_that_call_the_operator(decoder):
    from edgekit.kernels.attention import attention_prefill_reference

    e = Engine(decoder, None, SHAPES, cuda_graphs=True)
    try:
        want = _staggered(e, 24)
        e.switch_operator("attention_prefill", lambda q, k, v, s, sc, w: attention_prefill_reference(q, k, v, s, sc, w),
                          "plugin:v2")
        prep = e.swap_prepares[-1]
        assert prep["captured"] == [f"prefill T={T}" for T in SHAPES.buckets], prep
        assert prep["reused"] == [f"decode b={b}" for b in e.batch_buckets], prep
        assert _staggered(e, 24) == want
        e.switch_operator("attention_decode", e.table.get("attention_decode"), "plugin:v2")
        # the per-operator decode graphs call it, and the fused path subsumes it (a swap falls back); prefill never calls it
        assert e.swap_prepares[-1]["captured"] == [f"decode b={b}" for b in e.batch_buckets], e.swap_prepares[-1]
        assert _staggered(e, 24) == want
    finally:
        e.close()

def test_a_graphed_engine_serves_a_prompt_past_its_largest_bucket_as_one_whole_prefill_would(default_model):
    """The graphed runner has no prefill graph longer than the largest bucket (32): such a prompt goes in eager chunks
    of that bucket (the server used to refuse it). Real weights, FP32 on the GPU, against one whole prefill."""
    from edgekit.generate import Generator

    dec = default_model.decoder(device="cuda", dtype=torch.float32)
    prompt = default_model.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 8)[:70]
    assert len(prompt) == 70
    whole = Generator(dec, StaticShapes(buckets=(96,), max_seq_len=96)).generate(prompt, 12)[0]
    e = Engine(dec, None, SHAPES, cuda_graphs=True)
    try:
        assert e.graphed
        job = e.submit(prompt, 12, stop_ids=())
        assert job.done.wait(120) and job.error is None, job.error
        assert job.tokens == whole
        assert [n for n, _ in e.prefill_units] == [32, 32, 6]
    finally:
        e.close()
