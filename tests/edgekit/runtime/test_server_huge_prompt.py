"""Attack 2: an 8 MB prompt. Before: tokenized inside the async handler, blocking every client for ~16 s.

Now: the body limit refuses it while it streams in; a prompt under the body limit that cannot fit the largest
bucket is refused before tokenization; and tokenization runs off the event loop."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from runtime_helpers import live_server

from edgekit.runtime.server import MAX_REQUEST_BODY_BYTES, create_app

pytestmark = pytest.mark.serial  # it times wall-clock behaviour: scripts/test.sh runs it alone, after the parallel phase


@pytest.fixture()
def url(smol_engine):
    with live_server(create_app(smol_engine)) as u:
        yield u


def test_8mb_prompt_is_refused_by_the_body_limit(url):
    t = time.perf_counter()
    r = httpx.post(url + "/v1/completions", json={"prompt": "a" * (8 << 20), "max_tokens": 4}, timeout=30)
    assert r.status_code == 413 and str(MAX_REQUEST_BODY_BYTES) in r.json()["error"]["message"]
    assert time.perf_counter() - t < 10


def test_prompt_that_cannot_fit_is_refused_before_tokenization(smol_engine, monkeypatch):
    calls = []
    monkeypatch.setattr(smol_engine, "encode", lambda *a, **k: calls.append(1) or [1])
    c = TestClient(create_app(smol_engine))
    r = c.post("/v1/completions", json={"prompt": "word " * 100_000, "max_tokens": 4})  # 500 KB: under the body limit
    assert r.status_code == 413 and r.json()["error"]["param"] == "prompt" and calls == []
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 100_000}]})
    assert r.status_code == 413 and r.json()["error"]["param"] == "messages" and calls == []


def test_tokenization_does_not_block_other_clients(smol_engine, monkeypatch):
    real = smol_engine.encode
    inside = threading.Event()

    def slow_encode(*a, **k):  # a tokenizer stuck for 3 s, as on a huge input
        inside.set()
        time.sleep(3)
        return real(*a, **k)

    monkeypatch.setattr(smol_engine, "encode", slow_encode)
    with live_server(create_app(smol_engine)) as u:
        slow = threading.Thread(target=lambda: httpx.post(u + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1},
                                                          timeout=30))
        slow.start()
        assert inside.wait(10)
        t = time.perf_counter()
        r = httpx.get(u + "/healthz", timeout=10)
        waited = time.perf_counter() - t
        slow.join(30)
    assert r.status_code == 200
    assert waited < 1.5, f"/healthz waited {waited:.2f} s behind a tokenization"


def test_a_413_tells_an_http_client_what_to_send_not_which_cli_flags_to_pass(smol_engine):
    """#33 (low): the 413 for a prompt that does not fit said "lower --max-new-tokens, or pass --truncate"."""
    c = TestClient(create_app(smol_engine))
    too_long = list(range(1, smol_engine.shapes.max_seq_len + 10))
    r = c.post("/v1/completions", json={"prompt": too_long, "max_tokens": 4})
    assert r.status_code == 413, r.text
    message = r.json()["error"]["message"]
    assert "--" not in message and "max_tokens" in message and "shorten the prompt" in message, message


def test_chat_messages_too_long_for_the_kv_cache_name_messages(smol_engine):
    """A chat request has no field "prompt": its 413 named one (param "prompt", "shorten the prompt")."""
    c = TestClient(create_app(smol_engine))
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello world " * 60}],
                                             "max_tokens": 4})  # ~120 tokens with the template: past 96
    assert r.status_code == 413, r.text
    err = r.json()["error"]
    assert err["param"] == "messages" and "shorten the messages" in err["message"], err


def test_a_prompt_past_the_largest_bucket_is_answered(smol_engine):
    """Buckets (32, 64), KV cache 96: a 73-token prompt used to get a 413 from the server while `edgekit run` answered
    it; it is prefilled in chunks of the largest bucket and answered as one whole prefill would."""
    from edgekit.generate import Generator
    from edgekit.shapes import StaticShapes

    prompt = list(range(1, smol_engine.shapes.buckets[-1] + 10))
    c = TestClient(create_app(smol_engine))
    r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(prompt)
    whole = Generator(smol_engine.decoder, StaticShapes(buckets=(96,), max_seq_len=96)).generate(prompt, 4)[0]
    assert r.json()["choices"][0]["text"] == smol_engine.decode_text(whole)
