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
