"""The HTTP server in-process (FastAPI TestClient: no sockets): routes, limits, admin auth."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from runtime_helpers import write_admin_token

from edgekit.runtime.engine import Engine
from edgekit.runtime.server import create_app
from edgekit.shapes import StaticShapes

TOKEN = "t0ken-for-tests-0123456789abcdef"


class RecordingPlugins:
    """A plugin admin that records calls; the server's job here is auth, limits and routing."""

    def __init__(self):
        self.installed: list[int] = []

    def list(self):
        return [{"op": "rmsnorm", "version": 1}]

    def install(self, package: bytes, *, allow_downgrade: bool = False):
        self.installed.append(len(package))
        return {"op": "rmsnorm", "version": 2, "bytes": len(package)}

    def rollback(self, op: str):
        return {"op": op, "active": "reference"}


@pytest.fixture(scope="module")
def engine(default_model):
    dec = default_model.decoder()
    return Engine(dec, default_model.tokenizer, StaticShapes(buckets=(32, 64), max_seq_len=96),
                  stop_ids=default_model.config.eos_token_ids, max_waiting=2, model_name="smollm2-135m")


@pytest.fixture()
def client(engine, tmp_path):
    tok = write_admin_token(tmp_path / "admin.token", TOKEN)
    plugins = RecordingPlugins()
    c = TestClient(create_app(engine, admin_token_file=str(tok), plugins=plugins))
    c.plugins = plugins
    return c


def test_chat_completion_answers(client):
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 12})
    assert r.status_code == 200, r.text
    body = r.json()
    assert "Paris" in body["choices"][0]["message"]["content"]
    assert body["usage"]["completion_tokens"] <= 12


def test_completion_and_length_finish(client):
    r = client.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 3})
    assert r.status_code == 200
    c = r.json()["choices"][0]
    assert c["finish_reason"] in ("length", "stop") and r.json()["usage"]["completion_tokens"] <= 3


def test_over_length_prompt_is_413_with_the_limit(client):
    """Past the largest bucket (64) a prompt is prefilled in chunks; the KV cache (96, 4 kept for the answer) bounds it."""
    r = client.post("/v1/completions", json={"prompt": "word " * 200, "max_tokens": 4})
    assert r.status_code == 413
    assert "at most 92 fit (the KV cache holds 96 tokens" in r.json()["detail"]


def test_bad_request_body_is_400_naming_the_field(client):
    r = client.post("/v1/completions", json={"max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens" and "max_tokens" in r.json()["detail"]


def test_health_and_metrics(client):
    h = client.get("/healthz").json()
    assert h["status"] == "ok" and h["operators"]["rmsnorm"] == "reference"
    client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
    m = client.get("/metrics").text
    assert "edgekit_request_latency_seconds_bucket" in m and 'le="0.005"' in m
    assert 'edgekit_requests_total{route="completions",status="200"}' in m


def test_an_unknown_route_or_method_says_what_came_and_what_to_send(client):
    """Both were Starlette's bare "Not Found" / "Method Not Allowed": a stock OpenAI client whose base_url lacks /v1
    posts to /chat/completions and could not tell why."""
    r = client.post("/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 404
    message = r.json()["error"]["message"]
    assert message.startswith("POST /chat/completions: no such route") and "POST /v1/chat/completions" in message
    assert "base_url ends in /v1" in message, message
    r = client.get("/v1/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["message"] == "GET /v1/completions: method not allowed; this route takes POST"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong-token-xxxxxxxxxxxxxxxx"}, {"Authorization": TOKEN}])
def test_admin_routes_need_the_token(client, headers):
    assert client.get("/v1/plugins", headers=headers).status_code == 401
    r = client.post("/v1/plugins", headers=headers, files={"file": ("p.tar", b"x" * 10)})
    assert r.status_code == 401 and client.plugins.installed == []
    assert client.post("/v1/plugins/rmsnorm/rollback", headers=headers).status_code == 401


def test_admin_routes_with_the_token(client):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/v1/plugins", headers=auth).json()["plugins"][0]["op"] == "rmsnorm"
    r = client.post("/v1/plugins", headers=auth, files={"file": ("p.tar", b"x" * 100)})
    assert r.status_code == 200 and r.json()["bytes"] == 100
    assert client.post("/v1/plugins/rmsnorm/rollback", headers=auth).json()["active"] == "reference"


def test_oversized_upload_is_413(client, monkeypatch):
    import edgekit.runtime.server as server

    monkeypatch.setattr(server, "MAX_PLUGIN_UPLOAD_BYTES", 1000)
    r = client.post("/v1/plugins", headers={"Authorization": f"Bearer {TOKEN}"}, files={"file": ("p.tar", b"x" * 5000)})
    assert r.status_code == 413 and client.plugins.installed == []


def test_capacity_is_429(engine, client, monkeypatch):
    # no room in the admission queue, as when every row decodes and max_waiting requests wait
    monkeypatch.setattr(engine, "max_waiting", -len(engine._rows))
    r = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    monkeypatch.undo()
    assert client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2}).status_code == 200


def test_short_admin_token_is_refused(engine, tmp_path):
    from edgekit.errors import EdgekitError

    tok = write_admin_token(tmp_path / "t", "short")
    with pytest.raises(EdgekitError, match="at least 16"):
        create_app(engine, admin_token_file=str(tok))
