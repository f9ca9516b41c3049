"""The watchdog's log: one JSON object per line, appended as it happens.

Record types: ``meta`` (once, first: format version, sensors, policy),
``sample`` (a power/thermal reading), ``latency`` (window percentiles per
metric) and ``event``. Appending keeps every record written before a crash; the
reader skips a torn last line (and any other line that is not JSON) and says
how many it skipped.

A log that reaches ``max_bytes`` (64 MiB by default) is rotated: it becomes
``NAME.1`` (replacing the one before) and a new ``NAME`` starts with the same
meta record, so a device's disk holds at most two logs' worth and each file
stands alone for `edgekit report`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError

LOG_FORMAT_VERSION = 1
DEFAULT_MAX_BYTES = 64 * 2**20  # then NAME -> NAME.1: a device running for months keeps two logs, not gigabytes


class JsonlLogger:
    def __init__(self, path: str | Path, flush_interval_s: float = 1.0, max_bytes: int | None = DEFAULT_MAX_BYTES):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")
        self._lock = threading.Lock()
        self.flush_interval_s = flush_interval_s
        self._last_flush = time.monotonic()
        self.records = 0
        self.max_bytes = max_bytes
        self.rotations = 0
        self._meta: dict[str, Any] | None = None  # written again at the top of a rotated log

    def write(self, record: dict[str, Any], flush: bool = False) -> None:
        line = json.dumps(record, separators=(",", ":"), default=str) + "\n"
        with self._lock:
            if self._f.closed:
                return
            if self.max_bytes is not None and self._f.tell() + len(line) > self.max_bytes and self._f.tell() > 0:
                self._rotate()
            self._f.write(line)
            self.records += 1
            now = time.monotonic()
            if flush or now - self._last_flush >= self.flush_interval_s:
                self._f.flush()
                self._last_flush = now

    def _rotate(self) -> None:
        """NAME -> NAME.1 (atomic rename), then a fresh NAME opening with the meta record. Under the lock."""
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        self._f = open(self.path, "a", encoding="utf-8")
        self.rotations += 1
        if self._meta is not None:
            self._f.write(json.dumps({**self._meta, "rotated_from": f"{self.path.name}.1"}, separators=(",", ":"),
                                     default=str) + "\n")

    def meta(self, **fields: Any) -> None:
        record = {"type": "meta", "format_version": LOG_FORMAT_VERSION, "t_s": time.time(), **fields}
        self._meta = record
        self.write(record, flush=True)

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.flush()
                os.fsync(self._f.fileno())
                self._f.close()

    def __enter__(self) -> "JsonlLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class LogContents:
    meta: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    latency: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    skipped_lines: list[int] = field(default_factory=list)


def iter_records(path: str | Path) -> Iterator[tuple[int, dict[str, Any] | None]]:
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                yield n, None
                continue
            yield n, rec if isinstance(rec, dict) else None


def read_log(path: str | Path) -> LogContents:
    p = Path(path)
    if not p.is_file():
        raise EdgekitError(f"{p}: no such log file", hint="pass the JSONL file written by `edgekit monitor --log` or the runtime's watchdog")
    out = LogContents()
    buckets = {"meta": out.meta, "sample": out.samples, "latency": out.latency, "event": out.events}
    for n, rec in iter_records(p):
        if rec is None or rec.get("type") not in buckets:
            out.skipped_lines.append(n)
            continue
        buckets[rec["type"]].append(rec)
    return out
