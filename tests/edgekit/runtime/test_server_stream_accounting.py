"""#32 row 15 and #33's empty chunk: what a stream's log line and usage say, and the chunks it is made of.

Before: a streamed request whose client hung up was logged as 200 with finish_reason null; usage counted the
tokens generated after the stop string (they were never returned); an empty chunk came before the last.
Now: a hang-up is logged as 499 "cancelled"; usage counts the tokens up to the one that completed the stop string;
no empty delta chunk is sent."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.runtime.server import create_app


@pytest.fixture(scope="module")
def client(smol_engine):
    return TestClient(create_app(smol_engine))


def test_usage_with_a_stop_string_counts_what_was_returned(client, smol_engine):
    prompt = smol_engine.encode(prompt="Count slowly: one, two, three, four, five, six, seven")
    job = smol_engine.submit(prompt, 24, stop_ids=())
    assert job.done.wait(120) and job.error is None
    text = smol_engine.decode_text(job.tokens)
    stop = text.strip()[4:8]  # a piece of the answer, a few tokens in
    needed = next(n for n in range(1, len(job.tokens) + 1) if stop in smol_engine.decode_text(job.tokens[:n]))
    for stream in (False, True):
        body = {"prompt": prompt, "max_tokens": 24, "stop": [stop], "ignore_eos": True, "stream": stream,
                "stream_options": {"include_usage": True} if stream else None}
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        if stream:
            chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
            usage = next(c["usage"] for c in chunks if c.get("usage"))
            returned = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        else:
            usage, returned = r.json()["usage"], r.json()["choices"][0]["text"]
        assert stop not in returned and returned == text[: text.find(stop)]
        assert usage["completion_tokens"] == needed, (stream, usage, needed)


def test_a_stream_sends_no_empty_delta_chunks(client):
    body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 24, "stream": True}
    r = client.post("/v1/chat/completions", json=body)
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    assert deltas[0]["delta"] == {"role": "assistant", "content": ""} and deltas[-1]["finish_reason"] in ("stop", "length")
    assert all(d["delta"].get("content") for d in deltas[1:-1]), [d["delta"] for d in deltas]


def test_a_streamed_hang_up_is_logged_as_cancelled(tiny_server):
    url, stack, _ = tiny_server

    def slow(x, w, eps):  # the hang-up lands mid-answer
        time.sleep(0.002)
        return rmsnorm_reference(x, w, eps)

    stack.engine.switch_operator("rmsnorm", slow, "plugin:slow")
    body = {"prompt": [1, 2], "max_tokens": 60, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # hang up after the first chunk
    for _ in range(200):
        stack.log.flush()
        lines = [json.loads(x) for x in stack.log.path.read_text().splitlines()]
        streamed = [x for x in lines if x.get("type") == "request" and x.get("stream")]
        if streamed:
            break
        time.sleep(0.05)
    assert [(x["status"], x["finish_reason"]) for x in streamed] == [(499, "cancelled")], streamed
