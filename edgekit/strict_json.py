"""Strict JSON: what edgekit writes is read by any JSON parser, so no NaN or Infinity tokens (Python's json
writes them by default; JavaScript's JSON.parse, jq and most other readers refuse the document)."""

from __future__ import annotations

import json
import math
from typing import Any, Callable


def _null(_: float) -> None:
    return None


def finite_json(x: Any, replace: Callable[[float], Any] = _null) -> Any:
    """``x`` with every non-finite float (NaN, inf, -inf) in its dicts, lists and tuples replaced by ``replace(value)``:
    null by default (the --json documents), ``str`` for report.json's "inf" (an exact match has infinite SNR).
    Dump the result with ``allow_nan=False``, so a value this misses is an error, not invalid JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return replace(x)
    if isinstance(x, dict):
        return {k: finite_json(v, replace) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_json(v, replace) for v in x]
    return x


def strict_dumps(x: Any, *, replace: Callable[[float], Any] = _null, **kwargs: Any) -> str:
    """``json.dumps`` of ``finite_json(x, replace)`` with ``allow_nan=False`` (and ``default=str``, which every
    edgekit document uses for paths and the like): the one way edgekit spells a JSON document."""
    return json.dumps(finite_json(x, replace), allow_nan=False, default=str, **kwargs)


def write_json_file(path, data: Any, *, indent: int = 2) -> None:
    """A strict JSON document to a file, replaced atomically (temp file, fsync, rename): what ``plan -o``, ``bench
    --json`` and the decode-vs-llama.cpp script write. Missing parent folders are created, as ``check_output_path``
    (asked before the work) promises."""
    from pathlib import Path

    from edgekit.durable import replace_atomically

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, (strict_dumps(data, indent=indent) + "\n").encode())
