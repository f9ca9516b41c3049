"""Token ids -> text deltas for streaming, with OpenAI ``stop`` strings.

Text is re-decoded from all tokens so far (tokenizers merge bytes across
tokens), and a delta is released only when it can no longer change: not while
it ends in an incomplete UTF-8 sequence (decoded as U+FFFD), and not the last
few characters that could still be the start of a stop string.
"""

from __future__ import annotations

from typing import Callable


class TextStream:
    def __init__(self, decode: Callable[[list[int]], str], stops: list[str]):
        self.decode, self.stops = decode, stops
        self.tokens: list[int] = []
        self.sent = 0  # characters of the text already released
        self.stopped = False  # a stop string was seen: the caller cancels generation
        self._hold = max((len(s) for s in stops), default=1) - 1
        self._text = ""

    def push(self, token: int) -> str:
        """Add a token; return the text that is now final (may be empty)."""
        if self.stopped:
            return ""
        self.tokens.append(token)
        self._text = self.decode(self.tokens)
        for s in self.stops:
            at = self._text.find(s, max(self.sent - len(s), 0))
            if at >= 0:
                self.stopped = True
                self._text = self._text[:at]
                return self._release(len(self._text))
        safe = len(self._text) - self._hold
        if self._text.endswith("\ufffd"):  # an incomplete multi-byte character: wait for its next token
            safe = min(safe, len(self._text.rstrip("\ufffd")))
        return self._release(safe)

    def finish(self) -> str:
        """Everything not yet released (generation ended)."""
        return self._release(len(self._text))

    @property
    def text(self) -> str:
        return self._text

    def _release(self, upto: int) -> str:
        if upto <= self.sent:
            return ""
        out, self.sent = self._text[self.sent:upto], upto
        return out
