"""One process-wide lock for the GPU work admin threads do beside serving: graph warm-ups and captures, plugin
module loads, golden checks.

Why: a server has two admin threads (HTTP admin calls; probation decisions and rollbacks) and both touch the
GPU. A CUDA graph capture in progress on one thread makes a device-wide synchronize on any other thread
illegal (it would wait for the capturing stream, so CUDA refuses it), and calls that may synchronize implicitly
(a module unload) are no safer. On the H200 a serve bench saw an install's golden check fail with "operation
not permitted" (most likely a probation rollback re-capturing graphs on the other admin thread at that moment),
so a healthy plugin was refused as a golden mismatch; the check could as well have invalidated the capture. Everything of that kind takes this lock, so none of it overlaps.

The device thread never takes it: it only replays graphs that are already captured, so serving never waits on
admin work. The lock is re-entrant (an operator switch holds it across the load of the plugin and the capture
of the graphs that use it). ``capture_graph`` is the only way edgekit captures a graph: under the lock, in
thread-local capture mode (other threads' calls, the device thread's replays and allocations among them, are
not checked against this capture).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

_LOCK = threading.RLock()
_depth = threading.local()  # per thread: how many nested holds of _LOCK (for held_here)


@contextmanager
def gpu_admin_work() -> Iterator[None]:
    """Hold the process-wide lock for admin GPU work (captures, warm-ups, plugin loads, golden checks)."""
    with _LOCK:
        _depth.n = getattr(_depth, "n", 0) + 1
        try:
            yield
        finally:
            _depth.n -= 1


def held_here() -> bool:
    """Whether the calling thread holds the lock (the device thread never should)."""
    return getattr(_depth, "n", 0) > 0


_pinned = threading.local()  # per thread: the stream warm-ups and captures use instead of a side stream of their own


@contextmanager
def pinned_stream(stream) -> Iterator[None]:
    """On this thread, warm-ups (``side_stream``) and captures (``capture_graph`` without a stream) use ``stream``.

    Why: the side stream ``torch.cuda.Stream()`` gives, and the one ``torch.cuda.graph`` captures on by default, come
    from torch's per-device stream pool (at::cuda::getStreamFromPool), made once in the context current at the time
    (the primary one). A stream runs its work with its own context's SMs, so while a green context's stream is
    current (edgekit.bench.sm_partition) that work, and every kernel of a graph captured there, would run on the
    whole GPU. Pinned to the green context's stream, warm-up, capture and replay all stay inside it.
    """
    before = getattr(_pinned, "stream", None)
    _pinned.stream = stream
    try:
        yield
    finally:
        _pinned.stream = before


def side_stream():
    """The stream a warm-up before a capture runs on: the pinned one, else a side stream from torch's pool."""
    import torch

    pinned = getattr(_pinned, "stream", None)
    return pinned if pinned is not None else torch.cuda.Stream()


@contextmanager
def capture_graph(graph, stream=None) -> Iterator[None]:
    """``torch.cuda.graph(graph, stream=stream)`` under the lock, in thread-local capture mode; without ``stream``,
    on the pinned stream (``pinned_stream``) where there is one, else on torch.cuda.graph's own side stream."""
    import torch

    if stream is None:
        stream = getattr(_pinned, "stream", None)
    with gpu_admin_work(), torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        yield
