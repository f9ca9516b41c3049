"""Token ids -> text deltas for streaming, with OpenAI ``stop`` strings.

Decoding is incremental, as in text-generation-inference: a few tokens before
the new ones are decoded with them (so a tokenizer that merges bytes or spaces
across tokens gets its context) and the new text is the difference; the cost
per token stays constant however long the answer grows. A delta is released
only when it can no longer change: not while it ends in an incomplete UTF-8
sequence (decoded as U+FFFD), and not the last few characters that could
still be the start of a stop string.
"""

from __future__ import annotations

from typing import Callable


class TextStream:
    def __init__(self, decode: Callable[[list[int]], str], stops: list[str]):
        self.decode, self.stops = decode, stops
        self.tokens: list[int] = []  # pushed until a stop string was complete: what the returned text came from
        self.stopped = False  # a stop string was seen: the caller cancels generation
        self._prefix = 0  # tokens[_prefix:_read] is the context already turned into text
        self._read = 0
        self._text = ""  # all text decoded so far (after a stop: cut before it)
        self._sent = 0  # characters of _text already released
        self._hold = max((len(s) for s in stops), default=1) - 1

    def push(self, token: int) -> str:
        """Add a token; return the text that is now final (may be empty)."""
        if self.stopped:
            return ""
        self.tokens.append(token)
        before = self.decode(self.tokens[self._prefix:self._read])
        now = self.decode(self.tokens[self._prefix:])
        if len(now) > len(before) and not now.endswith("\ufffd"):
            self._text += now[len(before):]
            self._prefix, self._read = self._read, len(self.tokens)
        # the earliest match of any stop string, whatever the order of the list (one token may complete several)
        hits = [at for s in self.stops if (at := self._text.find(s, max(self._sent - len(s), 0))) >= 0]
        if hits:
            self.stopped = True
            self._text = self._text[:min(hits)]
            return self._release(len(self._text))
        return self._release(len(self._text) - self._hold)

    def finish(self) -> str:
        """Everything not yet released (generation ended), including an incomplete last character."""
        if not self.stopped and self._read < len(self.tokens):
            tail = self.decode(self.tokens[self._prefix:])[len(self.decode(self.tokens[self._prefix:self._read])):]
            self._text += tail
            self._read = len(self.tokens)
        return self._release(len(self._text))

    @property
    def text(self) -> str:
        return self._text

    def _release(self, upto: int) -> str:
        if upto <= self._sent:
            return ""
        out, self._sent = self._text[self._sent:upto], upto
        return out
