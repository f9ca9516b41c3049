"""Structured logs: every request, install, rollback and runtime event is one JSON line in the store's server.jsonl."""

from __future__ import annotations

import json

import httpx

from runtime_helpers import plugin_packages

from edgekit.kernels.rmsnorm import rmsnorm_reference


def test_requests_swaps_rollbacks_and_faults_are_json_lines(tiny_server, tiny_bundle):
    url, stack, auth = tiny_server
    with httpx.Client(base_url=url, timeout=60) as c:
        assert c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 3}).status_code == 200
        assert c.post("/v1/completions", json={"prompt": [1], "temperature": -1}).status_code == 400
        assert c.post("/v1/plugins", headers=auth, files={"file": ("p.tar", plugin_packages(tiny_bundle, "rmsnorm", [2])[0])}).status_code == 200
        # the new plugin faults (non-finite output on probation): it falls back, and the stack rolls it back
        g = stack.engine.table.get("rmsnorm")
        g.fn = lambda x, w, eps: rmsnorm_reference(x, w, eps) * float("nan")
        assert c.post("/v1/completions", json={"prompt": [4, 5], "max_tokens": 2}).status_code == 200
    stack.admin_worker.submit(lambda: None).result(30)
    stack.log.close()
    records = [json.loads(line) for line in (stack.store.root / "server.jsonl").read_text().splitlines()]
    requests = [r for r in records if r["type"] == "request"]
    assert {(r["route"], r["status"]) for r in requests} >= {("completions", 200), ("completions", 400), ("plugins", 200)}
    ok = next(r for r in requests if r["route"] == "completions" and r["status"] == 200)
    assert ok["completion_tokens"] == 3 and ok["prompt_tokens"] == 3 and ok["ms"] > 0 and "prompt" not in ok
    kinds = [r["kind"] for r in records if r["type"] == "event"]
    assert "operator_fault" in kinds and "rollback" in kinds
    assert stack.store.pointer("rmsnorm").version is None


def test_an_unwritable_log_never_turns_a_request_into_a_500(tiny_stack, tmp_path):
    """#32 row 7: `serve --log /dev/full`. Every answer keeps its own status; the lost records are counted."""
    from runtime_helpers import ADMIN_TOKEN, live_server, write_admin_token
    from edgekit.power.jsonl import JsonlLogger
    from edgekit.runtime.server import create_app

    full = JsonlLogger("/dev/full", flush_interval_s=0.0)
    tok = write_admin_token(tmp_path / "admin.token", ADMIN_TOKEN)
    app = create_app(tiny_stack.engine, admin_token_file=str(tok), plugins=tiny_stack.admin, log=full)
    with live_server(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        assert c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 3}).status_code == 200
        assert c.post("/v1/completions", json={"prompt": [1], "temperature": -1}).status_code == 400
        assert c.get("/v1/plugins").status_code == 401
        assert c.get("/v1/plugins", headers={"Authorization": "Bearer nope"}).status_code == 401
        metrics = c.get("/metrics").text
    assert full.dropped >= 4
    assert "edgekit_log_records_dropped" in metrics


def test_an_unexpected_exception_is_a_logged_500(tiny_server):
    """Only EdgekitError 500s were logged; a bug's exception left no line in server.jsonl."""
    url, stack, _ = tiny_server

    def broken(*a, **k):
        raise RuntimeError("a bug in the engine")

    stack.engine.submit_group = broken
    r = httpx.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2}, timeout=60)
    assert r.status_code == 500 and "RuntimeError" in r.json()["error"]["message"]
    assert "a bug in the engine" not in r.text  # the detail stays in the local log
    stack.log.flush()
    records = [json.loads(line) for line in stack.log.path.read_text().splitlines()]
    (bug,) = [x for x in records if x["type"] == "request" and x["status"] == 500]
    assert bug["route"] == "completions" and bug["error"] == "RuntimeError: a bug in the engine" and "ms" not in bug


def test_a_refused_request_logs_why(tiny_server):
    """A 400/413 the handler refuses (a prompt too long for the KV cache, a text prompt to a model without a
    tokenizer) was logged with its field alone: server.jsonl could not say why, as it does for every other 4xx."""
    url, stack, _ = tiny_server
    too_long = list(range(1, 65))  # the tiny bundle's KV cache holds 64 tokens
    with httpx.Client(base_url=url, timeout=60) as c:
        assert c.post("/v1/completions", json={"prompt": too_long, "max_tokens": 2}).status_code == 413
        assert c.post("/v1/completions", json={"prompt": "text", "max_tokens": 2}).status_code == 400
    stack.log.flush()
    records = [json.loads(line) for line in stack.log.path.read_text().splitlines()]
    refused = [x for x in records if x["type"] == "request" and x["status"] in (400, 413)]
    assert [x["param"] for x in refused] == ["prompt", "prompt"]
    assert "too long" in refused[0]["error"] and "no tokenizer" in refused[1]["error"], refused
