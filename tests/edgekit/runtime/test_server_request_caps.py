"""#32 row 3: one request that holds every decode row for minutes (n=4, ignore_eos, max_tokens 2047).

Before: it was admitted, took all four rows, and everyone else got 429 for ~13 minutes. Now a request may hold
at most one full row's worth of tokens (n x max_tokens <= the KV cache length; more is a 400 naming n and
max_tokens), and none runs past a wall-time cap (it ends with finish reason "length", its rows freed)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from edgekit.kernels.rmsnorm import rmsnorm_reference

pytestmark = pytest.mark.serial  # it times wall-clock behaviour: scripts/test.sh runs it alone, after the parallel phase


def _slow(x, w, eps):  # a step of ~50 ms: a long answer holds its rows for seconds
    time.sleep(0.01)
    return rmsnorm_reference(x, w, eps)


def test_n4_ignore_eos_max_tokens_request_cannot_take_every_row(tiny_server):
    url, stack, _ = tiny_server
    stack.engine.switch_operator("rmsnorm", _slow, "plugin:slow")
    longest = stack.engine.shapes.max_seq_len - 8  # with the 2-token prompt: one full row
    hog: list[httpx.Response] = []
    t = threading.Thread(target=lambda: hog.append(httpx.post(url + "/v1/completions", timeout=120, json={
        "prompt": [1, 2], "n": 4, "ignore_eos": True, "max_tokens": longest, "temperature": 0.8})), daemon=True)
    t.start()
    time.sleep(1.0)  # the hog is decoding if it was admitted
    r = httpx.post(url + "/v1/completions", json={"prompt": [3, 4], "max_tokens": 4}, timeout=60)
    t.join(120)
    assert r.status_code == 200, r.text  # the other client is served
    assert hog[0].status_code == 400, hog[0].text
    err = hog[0].json()["error"]
    assert err["param"] == "n" and "n=4" in err["message"] and f"max_tokens={longest}" in err["message"], err
    one_row = httpx.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": longest, "ignore_eos": True},
                         timeout=120)
    assert one_row.status_code == 200 and one_row.json()["usage"]["completion_tokens"] == longest  # one full row is fine


def test_a_request_past_its_wall_time_cap_ends_and_frees_its_row(tiny_stack):
    engine = tiny_stack.engine
    engine.max_request_s = 0.5
    engine.switch_operator("rmsnorm", _slow, "plugin:slow")
    t = time.perf_counter()
    job = engine.submit([1, 2], 60, stop_ids=())
    assert job.done.wait(30) and job.error is None
    assert job.finish_reason == "time_limit" and 2 <= len(job.tokens) < 60
    assert time.perf_counter() - t < 3.0 and engine.active_rows() == 0


def test_a_time_capped_answer_says_length_to_the_client_and_time_limit_in_the_log(tiny_server):
    """The client is told "length" (an OpenAI finish reason); server.jsonl said "length" too, so an operator could not
    tell an answer the wall-time cap cut from one that reached max_tokens."""
    url, stack, _ = tiny_server
    stack.engine.max_request_s = 0.5
    stack.engine.switch_operator("rmsnorm", _slow, "plugin:slow")
    body = {"prompt": [1, 2], "max_tokens": 40, "ignore_eos": True}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length", r.text
    assert r.json()["usage"]["completion_tokens"] < 40
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=60) as s:
        lines = [line for line in s.iter_lines() if line.startswith("data: {")]
    assert json.loads(lines[-1][6:])["choices"][0]["finish_reason"] == "length"
    stack.log.flush()
    records = [json.loads(line) for line in stack.log.path.read_text().splitlines()]
    served = [x for x in records if x["type"] == "request" and x["status"] == 200]
    assert [x["finish_reason"] for x in served] == ["time_limit", "time_limit"], served
