"""A careless client: starts a long streamed answer and hangs up after the first chunk. Its decode row is freed
at the next step instead of decoding to max_tokens for nobody."""

from __future__ import annotations

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
