"""serve on a bundle without a tokenizer (every preset's): text is refused with a 400 that says what to send, and a
token-id prompt's answer carries its token ids (there is no text to give)."""

from __future__ import annotations

import json

import httpx


def _log_lines(stack) -> list[dict]:
    stack.log.flush()
    return [json.loads(line) for line in stack.log.path.read_text().splitlines() if line.strip()]


def test_text_and_chat_prompts_get_a_400_that_says_to_send_token_ids(tiny_server):
    url, stack, _ = tiny_server
    assert stack.engine.tokenizer is None
    r = httpx.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 3}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "no tokenizer" in err["message"] and "token ids" in err["message"] and err["param"] == "prompt"
    r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
                   timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    statuses = [e["status"] for e in _log_lines(stack) if e.get("type") == "request"]
    assert statuses.count(400) == 2  # logged, as every refusal is


def test_a_token_id_prompt_gets_its_answer_as_token_ids(tiny_server):
    url, stack, _ = tiny_server
    r = httpx.post(url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 4, "ignore_eos": True}, timeout=120)
    assert r.status_code == 200, r.text
    (choice,) = r.json()["choices"]
    ids = choice["token_ids"]
    assert len(ids) == 4 == r.json()["usage"]["completion_tokens"]
    assert all(0 <= t < stack.engine.decoder.config.vocab_size for t in ids)


def test_a_stream_carries_the_token_ids_and_stop_strings_are_refused(tiny_server):
    url, _, _ = tiny_server
    body = {"prompt": [1, 2, 3], "max_tokens": 5, "ignore_eos": True, "stream": True}
    ids = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    ids += choice.get("token_ids", [])
    assert len(ids) == 5  # every token, once
    r = httpx.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 3, "stop": ["\n"]}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"


def _streamed(url: str, body: dict) -> tuple[list[int], list[str], dict | None]:
    """(token ids, finish reasons, usage) of a streamed completion."""
    ids, reasons, usage = [], [], None
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                for choice in chunk["choices"]:
                    ids += choice.get("token_ids", [])
                    reasons += [choice["finish_reason"]] if choice.get("finish_reason") else []
    return ids, reasons, usage


def test_an_answer_that_stops_on_the_eos_token_lists_it_as_usage_and_run_count_it(tiny_server, monkeypatch):
    """The end-of-sequence token that stopped the answer is its last token id (completion_tokens counts it, and
    `edgekit run --json`'s token_ids end with it): in the answer and in the stream, which dropped it when it arrived
    alone."""
    url, stack, _ = tiny_server
    body = {"prompt": [1, 2, 3], "max_tokens": 8}
    greedy = httpx.post(url + "/v1/completions", json={**body, "ignore_eos": True}, timeout=120).json()
    greedy = greedy["choices"][0]["token_ids"]
    k = next(i for i in range(2, len(greedy)) if greedy[i] not in greedy[:i])  # a token new at step k >= 2
    monkeypatch.setattr(stack.engine, "stop_ids", (greedy[k],))  # the model's EOS, as far as this test goes
    r = httpx.post(url + "/v1/completions", json=body, timeout=120).json()
    (choice,) = r["choices"]
    assert choice["token_ids"] == greedy[:k + 1] and choice["finish_reason"] == "stop"
    assert r["usage"]["completion_tokens"] == k + 1
    ids, reasons, usage = _streamed(url, {**body, "stream_options": {"include_usage": True}})
    assert (ids, reasons, usage["completion_tokens"]) == (greedy[:k + 1], ["stop"], k + 1)


def test_serve_help_and_the_readme_say_the_eos_token_is_listed():
    import subprocess
    import sys
    from pathlib import Path

    r = subprocess.run([sys.executable, "-m", "edgekit", "serve", "--help"], capture_output=True, text=True, timeout=120)
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    for text in (r.stdout, readme):
        words = " ".join(text.split())
        assert "end-of-sequence token lists that token last" in words and "completion_tokens" in words
