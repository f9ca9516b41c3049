"""Tokens from the device thread to the event loop, with at most one wake-up of the loop in flight.

Waking an asyncio loop from another thread (``call_soon_threadsafe``) writes
to its self-pipe: a system call on the device thread that releases the GIL,
after which the device thread waits for the GIL while the loop handles the
token. Profiling one streaming client on the CPU (py-spy, tiny preset) put a
third of the device thread's samples in that write. So the device thread only
appends to a request's channel; the first append after the loop last drained
schedules one wake-up for every channel with news, and the appends that come
while it is pending (the other rows of the same decode step, or more steps
while the loop is busy) cost no system call at all. The loop then hands each
request everything that arrived since it last looked, in one batch.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class TokenFeed:
    """One per event loop: coalesces the wake-ups of all channels that belong to it."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: list[TokenChannel] = []
        self._scheduled = False
        self.wakeups = 0  # loop wake-ups scheduled (tests compare it with the items delivered)

    def channel(self) -> TokenChannel:
        """A channel for one request; create it on the loop's thread."""
        return TokenChannel(self)

    def _notify(self, ch: TokenChannel) -> None:  # any thread
        with self._lock:
            if not ch._queued:
                ch._queued = True
                self._pending.append(ch)
            if self._scheduled:
                return
            self._scheduled = True
            self.wakeups += 1
        try:
            self._loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the loop is closed (server shutting down): nobody is listening any more
            pass

    def _flush(self) -> None:  # on the loop
        with self._lock:
            chans, self._pending, self._scheduled = self._pending, [], False
            for ch in chans:
                ch._queued = False
        for ch in chans:
            ch._ready.set()


class TokenChannel:
    """Items (``(kind, value)`` tuples) put by the device thread, taken in batches by one coroutine."""

    def __init__(self, feed: TokenFeed):
        self._feed = feed
        self._items: list[tuple[str, Any]] = []
        self._ready = asyncio.Event()
        self._queued = False  # guarded by the feed's lock: already in the feed's pending list

    def put(self, kind: str, value: Any) -> None:
        """From any thread: no system call unless the loop has to be woken."""
        self._items.append((kind, value))  # atomic under the GIL; get_batch swaps the list out whole
        self._feed._notify(self)

    async def get_batch(self) -> list[tuple[str, Any]]:
        """Everything put since the last call (at least one item), waiting for the first if there is none."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            if self._items:
                items, self._items = self._items, []
                return items
