"""Server-sent-event frames of one OpenAI completion stream, encoded once per request.

Every chunk of a stream repeats the same envelope (id, object, created, model)
around a small delta. The envelope is encoded when the stream starts; a chunk
then costs one ``json.dumps`` of its delta text, not a dict build and a
re-encoding of the whole object per token (the event loop's share of the
per-token work: see token_feed.py for the device thread's).
"""

from __future__ import annotations

import json


class ChunkEncoder:
    def __init__(self, rid: str, created: int, model: str, chat: bool):
        self.chat = chat
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": rid, "object": obj, "created": created, "model": model}
        self._head = b"data: " + json.dumps(head).encode()[:-1]  # the envelope without its closing brace
        # a delta chunk, split around the delta text (json.dumps(...) of the text goes in between), per choice
        self._delta_open: dict[int, bytes] = {}
        self._delta_close = (b'}, "logprobs": null, "finish_reason": null}]}\n\n' if chat
                             else b', "logprobs": null, "finish_reason": null}]}\n\n')

    def _frame(self, rest: dict) -> bytes:
        return self._head + b", " + json.dumps(rest).encode()[1:] + b"\n\n"

    def role(self, index: int = 0) -> bytes:
        """A chat choice's first chunk: the assistant role, no content yet."""
        return self._frame({"choices": [{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                         "finish_reason": None}]})

    def delta(self, text: str, index: int = 0) -> bytes:
        """A chunk of new text (an empty text still shows progress: a chat delta then carries no content)."""
        if self.chat and not text:
            return self._frame({"choices": [{"index": index, "delta": {}, "logprobs": None, "finish_reason": None}]})
        opening = self._delta_open.get(index)
        if opening is None:
            field = b'"delta": {"content": ' if self.chat else b'"text": '
            opening = self._delta_open[index] = self._head + b', "choices": [{"index": %d, ' % index + field
        return opening + json.dumps(text).encode() + self._delta_close

    def token_ids(self, ids: list[int], index: int = 0) -> bytes:
        """New token ids of a completion from a model without a tokenizer: its text is empty, so the ids are what
        the stream carries (an edgekit field beside the empty text)."""
        return self._frame({"choices": [{"index": index, "text": "", "token_ids": ids, "logprobs": None,
                                         "finish_reason": None}]})

    def finish(self, reason: str, index: int = 0) -> bytes:
        choice = {"index": index, "delta": {}} if self.chat else {"index": index, "text": ""}
        return self._frame({"choices": [{**choice, "logprobs": None, "finish_reason": reason}]})

    def usage(self, usage: dict) -> bytes:
        return self._frame({"choices": [], "usage": usage})

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"
