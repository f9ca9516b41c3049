"""A careless client: starts a long streamed answer and hangs up after the first chunk. Its decode row is freed
at the next step instead of decoding to max_tokens for nobody."""

from __future__ import annotations

import json
import time

import httpx

from edgekit.kernels.rmsnorm import rmsnorm_reference


def test_a_client_that_hangs_up_frees_its_row(tiny_server):
    url, stack, _ = tiny_server
    steps = {"n": 0}

    def counting(x, w, eps):  # slows each step a little so the hang-up lands mid-answer
        steps["n"] += 1
        time.sleep(0.002)
        return rmsnorm_reference(x, w, eps)

    stack.engine.switch_operator("rmsnorm", counting, "plugin:counting")
    body = {"prompt": [1, 2], "max_tokens": 60, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # hang up after the first chunk
    for _ in range(200):
        if stack.engine.active_rows() == 0:
            break
        time.sleep(0.02)
    assert stack.engine.active_rows() == 0
    calls_per_step = 2 * 2 + 1  # tiny preset: 2 layers x 2 norms + the final norm
    assert steps["n"] < 40 * calls_per_step  # far fewer than the 60 steps it asked for
    r = httpx.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2}, timeout=30)
    assert r.status_code == 200


def test_a_non_streaming_client_that_hangs_up_frees_its_row(tiny_server):
    """Without a stream nothing is written until the answer is ready, so only listening for the disconnect
    notices the hang-up: the engine must cancel the sequence and free its row long before max_tokens."""
    url, stack, _ = tiny_server
    steps = {"n": 0}

    def counting(x, w, eps):
        steps["n"] += 1
        time.sleep(0.002)
        return rmsnorm_reference(x, w, eps)

    stack.engine.switch_operator("rmsnorm", counting, "plugin:counting")
    body = {"prompt": [1, 2], "max_tokens": 60, "ignore_eos": True}
    calls_per_step = 2 * 2 + 1  # tiny preset: 2 layers x 2 norms + the final norm
    with httpx.Client(timeout=httpx.Timeout(30, read=0.15)) as c:
        try:
            c.post(url + "/v1/completions", json=body)
            raise AssertionError("the answer came before the client gave up; slow the steps down further")
        except httpx.ReadTimeout:
            pass  # the client gives up and closes its connection
    for _ in range(200):
        if stack.engine.active_rows() == 0:
            break
        time.sleep(0.02)
    assert stack.engine.active_rows() == 0
    assert steps["n"] < 40 * calls_per_step  # far fewer than the 60 steps it asked for
    r = httpx.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2}, timeout=30)
    assert r.status_code == 200


def test_a_client_that_hangs_up_during_a_long_prefill_ends_it_at_the_next_chunk(tiny_server):
    """The hang-up was listened for only once the first token was out: a client that gave up during a long prompt's
    prefill (2,000 tokens took 12 s of the default model on a 2-core CPU) had the whole prompt prefilled for nobody."""
    url, stack, _ = tiny_server
    calls = {"n": 0}

    def slow(x, w, eps):  # each 4-token chunk of the prompt takes ~0.25 s
        calls["n"] += 1
        time.sleep(0.05)
        return rmsnorm_reference(x, w, eps)

    stack.engine.switch_operator("rmsnorm", slow, "plugin:slow")
    stack.engine.prefill_chunk_tokens = 4  # a 48-token prompt goes in 12 chunks, ~3 s
    body = {"prompt": list(range(1, 49)), "max_tokens": 2, "ignore_eos": True}
    with httpx.Client(timeout=httpx.Timeout(30, read=0.5)) as c:
        try:
            c.post(url + "/v1/completions", json=body)
            raise AssertionError("the answer came before the client gave up; slow the chunks down further")
        except httpx.ReadTimeout:
            pass  # the client gives up mid-prefill and closes its connection
    for _ in range(500):  # the request's log line: written when it has ended
        stack.log.flush()
        if any(json.loads(line).get("status") == 499 for line in stack.log.path.read_text().splitlines()):
            break
        time.sleep(0.02)
    else:
        raise AssertionError("the request never ended")
    calls_per_chunk = 2 * 2 + 1  # tiny preset: 2 layers x 2 norms + the final norm
    assert calls["n"] < 6 * calls_per_chunk, calls  # the whole prompt is 12 chunks
