"""#32 row 14: a chat with ``developer``, ``assistant`` and several ``system`` messages.

Before: the prompt kept the first system message and the user messages joined; the others were silently dropped.
Now: every message goes through the model's chat template in order (``developer`` is OpenAI's newer name for
``system``), and a template that refuses the conversation is a 400 naming the messages, not a silent drop."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from edgekit.runtime.server import create_app

MESSAGES = [
    {"role": "system", "content": "Answer in French."},
    {"role": "developer", "content": "Keep every answer under ten words."},
    {"role": "user", "content": "What is the capital of Italy?"},
    {"role": "assistant", "content": "Rome est la capitale."},
    {"role": "system", "content": "Now answer in German."},
    {"role": "user", "content": "And of Spain?"},
]


def test_every_chat_role_reaches_the_prompt_in_order(smol_engine):
    prompt = smol_engine.decode_text(smol_engine.encode(messages=MESSAGES))
    at = [prompt.find(m["content"]) for m in MESSAGES]
    assert all(a >= 0 for a in at) and at == sorted(at), (at, prompt)
    assert "system\nKeep every answer under ten words." in prompt  # developer speaks as the system
    assert "assistant\nRome est la capitale." in prompt


def test_a_template_that_refuses_the_roles_is_a_400_naming_the_messages(smol_engine, monkeypatch):
    strict = ("{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
              "{{ raise_exception('only user and assistant roles are supported') }}{% endif %}"
              "{{ m['content'] }}{% endfor %}")
    monkeypatch.setattr(smol_engine.tokenizer._tok, "chat_template", strict)
    r = TestClient(create_app(smol_engine)).post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages" and "only user and assistant roles" in err["message"], err
