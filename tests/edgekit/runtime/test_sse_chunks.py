"""The pre-encoded SSE frames are the same JSON objects a dict-per-chunk encoder would write."""

from __future__ import annotations

import json

import pytest

from edgekit.runtime.sse_chunks import ChunkEncoder


def _parse(frame: bytes) -> dict:
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
    return json.loads(frame[6:-2])


@pytest.mark.parametrize("text", ["Hello", "", 'quote " and \\ backslash', "new\nline", "é ☃ \U0001F600", "</script>"])
def test_delta_chunks_are_valid_json_with_the_text(text):
    head = {"id": "cmpl-1", "created": 7, "model": 'm"odel'}
    chat = ChunkEncoder("cmpl-1", 7, 'm"odel', chat=True)
    c = _parse(chat.delta(text))
    assert {k: c[k] for k in head} == head and c["object"] == "chat.completion.chunk"
    assert c["choices"] == [{"index": 0, "delta": {"content": text} if text else {}, "logprobs": None, "finish_reason": None}]
    plain = _parse(ChunkEncoder("cmpl-1", 7, 'm"odel', chat=False).delta(text))
    assert plain["object"] == "text_completion"
    assert plain["choices"] == [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}]


def test_role_finish_usage_and_done_frames():
    enc = ChunkEncoder("chatcmpl-2", 1, "m", chat=True)
    assert _parse(enc.role())["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    fin = _parse(enc.finish("stop"))["choices"][0]
    assert fin["finish_reason"] == "stop" and fin["delta"] == {}
    u = _parse(enc.usage({"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}))
    assert u["choices"] == [] and u["usage"]["total_tokens"] == 3
    assert enc.done() == b"data: [DONE]\n\n"
