"""The serving engine: one model, one device, a bounded queue, and an operator table that can change under it.

Requests run one at a time on the device (batch-1 decode; the KV cache is
preallocated once). Each request takes a snapshot of the dispatch table when it
starts, so an operator swap never changes the kernels of a request in flight:
requests that start after the switch use the new table. The switch itself is
one reference assignment under a lock, which is the only pause a swap causes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from edgekit.errors import EdgekitError
from edgekit.generate import GenerationStats, Generator, SamplingConfig
from edgekit.kernels.dispatch import DispatchTable
from edgekit.model.decoder import Decoder
from edgekit.shapes import StaticShapes


class OverloadedError(EdgekitError):
    """More requests are waiting than the engine accepts; the client should retry later (HTTP 429)."""


@dataclass
class Completion:
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length"
    stats: GenerationStats


class Engine:
    def __init__(self, decoder: Decoder, tokenizer, shapes: StaticShapes, *, max_waiting: int = 8,
                 stop_ids: tuple[int, ...] = (), model_name: str = "edgekit"):
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.shapes = shapes
        self.stop_ids = stop_ids
        self.model_name = model_name
        self._table = decoder.ops
        self._switch_lock = threading.Lock()
        self._device_lock = threading.Lock()
        # admission: at most one running + max_waiting queued; beyond that, refuse at once
        self._slots = threading.BoundedSemaphore(max_waiting + 1)
        self._cache = decoder.new_cache(shapes.batch, shapes.max_seq_len)
        self.swap_pauses_s: list[float] = []
        self.shed_until = 0.0  # a watchdog action may ask to refuse new requests until then (monotonic s)
        self.observers: list[Callable[[GenerationStats], None]] = []

    # -- operators -------------------------------------------------------
    @property
    def table(self) -> DispatchTable:
        return self._table

    def switch_operator(self, op: str, fn: Callable | None, source: str) -> float:
        """Point `op` at `fn` (None: back to the torch reference). Returns the pause in seconds."""
        new = self._table.copy()  # prepared off the serving path
        if fn is None:
            new.reset(op)
        else:
            new.set(op, fn, source=source)
        t = time.perf_counter()
        with self._switch_lock:
            self._table = new
        pause = time.perf_counter() - t
        self.swap_pauses_s.append(pause)
        return pause

    # -- requests --------------------------------------------------------
    def encode(self, prompt: str | None = None, messages: list[dict] | None = None) -> list[int]:
        if self.tokenizer is None:
            raise EdgekitError("this model has no tokenizer", hint="serve a model or bundle that ships one")
        if messages is not None:
            system = next((m["content"] for m in messages if m.get("role") == "system"), None)
            user = "\n".join(m["content"] for m in messages if m.get("role") == "user")
            return self.tokenizer.encode_chat(user, system)
        return self.tokenizer.encode(prompt or "")

    def complete(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingConfig | None = None,
                 truncate: bool = False) -> Completion:
        # reject what cannot fit before queueing (raises ShapeError with the limit)
        self.shapes.fit_prompt(prompt_ids, max_new_tokens, truncate)
        if time.monotonic() < self.shed_until:
            raise OverloadedError("shedding load on a watchdog budget breach", hint="retry shortly")
        if not self._slots.acquire(blocking=False):
            raise OverloadedError("the server is at capacity: every request slot is taken", hint="retry shortly")
        try:
            with self._device_lock:
                with self._switch_lock:
                    table = self._table  # this request's operators, fixed for its whole life
                gen = Generator(self.decoder.with_ops(table), self.shapes, self._pad_id(), cache=self._cache)
                stats = GenerationStats()
                out = list(gen.stream(prompt_ids, max_new_tokens, stop_ids=self.stop_ids,
                                      sampling=sampling, truncate=truncate, stats=stats))
        finally:
            self._slots.release()
        for obs in self.observers:
            obs(stats)
        finish = "stop" if out and out[-1] in self.stop_ids else "length"
        text = self.tokenizer.decode(out) if self.tokenizer is not None else ""
        return Completion(out, text, finish, stats)

    def _pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer is not None else 0
