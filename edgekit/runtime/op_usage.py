"""Which dispatch-table operators a piece of work calls, so a swap re-captures only the CUDA graphs it touches.

A captured graph holds the kernels its capture launched. When one operator is
swapped, a graph whose capture never called it replays exactly what it would
after a re-capture, and can be kept (``GraphedRunner`` does so). The record is
made while warming up and capturing: ``watch`` returns a copy of the table whose
entries note their operator's name into the set ``recording()`` yields; the
copy calls the same implementations, so nothing else about the work changes.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from edgekit.kernels.dispatch import DispatchTable


class OpUsage:
    def __init__(self) -> None:
        self._into: set[str] | None = None

    def watch(self, table: DispatchTable) -> DispatchTable:
        """A copy of ``table`` (same implementations, same sources) whose calls are recorded."""
        out = table.copy()
        for op, source in table.sources().items():
            out.set(op, self._recorded(op, table.get(op)), source=source)
        return out

    @contextmanager
    def recording(self) -> Iterator[set[str]]:
        """The operators called through a watched table inside the block (one thread records at a time)."""
        used: set[str] = set()
        self._into = used
        try:
            yield used
        finally:
            self._into = None

    def _recorded(self, op: str, fn: Callable) -> Callable:
        def call(*args, **kwargs):
            if self._into is not None:
                self._into.add(op)
            return fn(*args, **kwargs)

        return call


def changed_operators(before: DispatchTable, after: DispatchTable) -> set[str]:
    """Operators whose implementation or source differs between two tables (a swap changes one)."""
    a, b = before.sources(), after.sources()
    return {op for op in a.keys() | b.keys()
            if a.get(op) != b.get(op) or (op in a and op in b and before.get(op) is not after.get(op))}
