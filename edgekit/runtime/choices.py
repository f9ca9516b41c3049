"""The choices of one completion request (OpenAI's ``n``): one engine sequence each, text deltas as tokens arrive.

The sequences share one token channel (token_feed.py); a token carries the
index of its choice. Deltas come per choice and per batch of tokens that
arrived together (possibly "" while text is held back, so a stream shows
progress every step; not for an end-of-sequence token alone, which ends it). Leaving the iteration early (a client hang-up, an
error) cancels every sequence, which frees their decode rows at the next step.
"""

from __future__ import annotations

from typing import AsyncIterator, Callable

from edgekit.runtime.engine import Job, OverloadedError
from edgekit.runtime.text_stream import TextStream
from edgekit.runtime.token_feed import TokenChannel


class Choices:
    def __init__(self, channel: TokenChannel, make_text: Callable[[], TextStream]):
        self.channel = channel
        self.jobs: list[Job] = []
        self._make_text = make_text
        self.texts: list[TextStream] = []
        self._index: dict[int, int] = {}  # id(job) -> choice index
        self._first: list | None = None

    # callbacks for Engine.submit_group (device thread)
    def on_token(self, index: int, token: int) -> None:
        self.channel.put("token", (index, token))

    def on_done(self, job: Job) -> None:
        self.channel.put("done", job)

    def started(self, jobs: list[Job]) -> None:
        self.jobs = jobs
        self.texts = [self._make_text() for _ in jobs]
        self._index = {id(j): i for i, j in enumerate(jobs)}

    async def refusal(self) -> Exception | None:
        """Wait for the first news. The error to answer with when sequences failed before any token arrived
        (an OverloadedError first: the client should retry), else None and the answer goes ahead."""
        self._first = await self.channel.get_batch()
        if any(kind == "token" for kind, _ in self._first):
            return None
        errors = [v.error for kind, v in self._first if kind == "done" and v.error is not None]
        return next((e for e in errors if isinstance(e, OverloadedError)), errors[0] if errors else None)

    async def deltas(self) -> AsyncIterator[tuple[int, str]]:
        """(choice index, text delta) as tokens arrive; raises a sequence's error; ends when every one is done."""
        batch = self._first if self._first is not None else await self.channel.get_batch()
        self._first = None
        done: set[int] = set()
        try:
            while True:
                tokens: dict[int, list[int]] = {}
                finished: list[Job] = []
                for kind, value in batch:
                    if kind == "token":
                        tokens.setdefault(value[0], []).append(value[1])
                    else:
                        finished.append(value)
                for i, toks in tokens.items():
                    text = self.texts[i]
                    delta = "".join(text.push(t) for t in toks)  # incremental: constant work per token
                    if text.stopped:
                        self.jobs[i].cancel()
                    if delta or not all(t in self.jobs[i].stop_ids for t in toks):  # an end-of-sequence token alone
                        yield i, delta  # is no progress: its empty chunk would come right before the finish chunk
                for job in finished:
                    if job.error is not None:
                        raise job.error
                    i = self._index[id(job)]
                    done.add(i)
                    tail = self.texts[i].finish()
                    if tail:
                        yield i, tail
                if len(done) == len(self.jobs):
                    return
                batch = await self.channel.get_batch()
        finally:
            self.cancel()  # no-op for finished sequences; frees the rows when the client went away

    def cancel(self) -> None:
        for job in self.jobs:
            job.cancel()

    def finish_reason(self, i: int) -> str:
        return "stop" if self.texts[i].stopped or self.jobs[i].finish_reason == "stop" else "length"

    def logged_reason(self, i: int) -> str:
        """The finish reason server.jsonl records: the client's, except for an answer the server cut short (its wall-time
        cap, a shutdown), which an OpenAI client is told as "length" but the operator must be able to tell apart."""
        engine_reason = self.jobs[i].finish_reason
        if engine_reason in ("time_limit", "shutdown") and not self.texts[i].stopped:
            return engine_reason
        return self.finish_reason(i)

    def hung_up(self) -> bool:
        """A sequence was cancelled without reaching a stop string: the client went away."""
        return any(j.finish_reason == "cancelled" and not t.stopped for j, t in zip(self.jobs, self.texts))

    def completion_tokens(self) -> int:
        """Tokens of the answer as returned: a choice cut by a stop string counts up to the token that completed
        it, not the ones its sequence generated before the cancel reached the device thread."""
        return sum(len(t.tokens) if t.stopped else len(j.tokens) for j, t in zip(self.jobs, self.texts))
