"""The dispatch table: the only way a model's forward reaches an operator.

The graph executor (``edgekit.graph.executor``) calls ``ops.get(name)(*args)``
for every operator node. Each call looks the implementation up at call time, so
replacing an entry (a Triton kernel, a hot-swapped plugin, a rollback to the
reference) takes effect at the next operator call without touching the model.
Replacing an entry is a single dict assignment, which is atomic under the GIL:
a call in flight finishes on the implementation it started with.
"""

from __future__ import annotations

from typing import Callable


from edgekit.errors import OperatorError
from edgekit.kernels.registry import OPERATORS


class DispatchTable:
    def __init__(self, implementations: dict[str, Callable] | None = None):
        self._impls: dict[str, Callable] = {name: op.reference for name, op in OPERATORS.items()}
        self._sources: dict[str, str] = {name: "reference" for name in OPERATORS}
        for name, fn in (implementations or {}).items():
            self.set(name, fn)

    # -- table management -------------------------------------------------
    def set(self, name: str, fn: Callable, source: str = "custom") -> None:
        if name not in OPERATORS:
            raise OperatorError(f"unknown operator {name!r}; expected one of: {', '.join(sorted(OPERATORS))}")
        self._impls[name] = fn
        self._sources[name] = source

    def reset(self, name: str) -> None:
        """Put the torch reference back for one operator."""
        self.set(name, OPERATORS[name].reference, source="reference")

    def copy(self) -> "DispatchTable":
        """An independent table with the same entries: a request keeps the table it started with."""
        t = DispatchTable()
        t._impls, t._sources = dict(self._impls), dict(self._sources)
        return t

    def get(self, name: str) -> Callable:
        return self._impls[name]

    def sources(self) -> dict[str, str]:
        """operator -> where its implementation came from ("reference", "triton", "plugin:<version>", ...)."""
        return dict(self._sources)
