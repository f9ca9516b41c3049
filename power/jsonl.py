"""The watchdog's and the server's logs: one JSON object per line, appended as it happens.

Record types: ``meta`` (once, first: format version, sensors, policy),
``sample`` (a power/thermal reading), ``latency`` (window percentiles per
metric) and ``event`` (the server adds ``request``). Appending keeps every record
written before a crash; the reader skips a torn last line (and any other line
that is not JSON, or not a record of these types) and says how many it skipped. A log is bounded (rotated at
``max_bytes``, ``backups`` old files kept), mode 0600, and a write that fails is
counted and dropped, never raised.
"""

from __future__ import annotations

import json
import math
import os
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError
from edgekit.strict_json import strict_dumps

LOG_FORMAT_VERSION = 1


# Bounds of one log: the file is rotated (LOG.1, LOG.2, ...) when it would pass max_bytes, and at most `backups` old
# files are kept. A 429 flood logs ~40 KB/s and an idle watchdog ~7 KB/s: without a bound either fills a device's disk.
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_BACKUPS = 3
_PENDING_MAX_BYTES = 64 * 1024  # written at once past this, whatever the flush interval


class JsonlLogger:
    """Appends JSON records, one a line, to a file of mode 0600 (logs name plugins, clients and errors).

    Never raises after it is open: a record that cannot be written (disk full, ``/dev/full``, a file removed under
    it) is counted in ``dropped`` and the caller goes on; a request must not fail because its log line did.
    Records are buffered and written at most every ``flush_interval_s`` (or at once with ``flush=True``).
    Rotation happens between whole lines, and each new file opens with the meta record again, so every file
    stands alone for `edgekit report`."""

    def __init__(self, path: str | Path, flush_interval_s: float = 1.0, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 backups: int = DEFAULT_BACKUPS):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_bytes, self.backups = max_bytes, backups
        self._fd: int | None = self._open()  # an unopenable path raises here, where the caller can say so
        self._size = os.fstat(self._fd).st_size
        self._lock = threading.Lock()
        self.flush_interval_s = flush_interval_s
        self._last_flush = time.monotonic()
        self._pending: list[str] = []
        self._pending_bytes = 0
        self._meta: dict[str, Any] | None = None  # written again at the top of a rotated log
        self.records = 0  # records handed to write()
        self.dropped = 0  # of those, lost to a failed write
        self.rotations = 0
        self.last_error: str | None = None

    def _open(self) -> int:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077:  # an older log made with the umask's mode
            os.fchmod(fd, 0o600)
        return fd

    def write(self, record: dict[str, Any], flush: bool = False) -> None:
        # strict JSON (null for an empty window's NaN jitter): jq and other readers refuse Python's NaN token
        line = strict_dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            if self._fd is None:
                return
            self._pending.append(line)
            self._pending_bytes += len(line)
            self.records += 1
            now = time.monotonic()
            if flush or now - self._last_flush >= self.flush_interval_s or self._pending_bytes > _PENDING_MAX_BYTES:
                self._flush_locked()
                self._last_flush = now

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        """Writes the pending lines, rotating before a line that would take the file past max_bytes."""
        if not self._pending or self._fd is None:
            return
        lines, self._pending, self._pending_bytes = self._pending, [], 0
        chunk: list[bytes] = []
        chunk_bytes = 0
        for line in lines:
            data = line.encode("utf-8", "replace")
            if self._size + chunk_bytes + len(data) > self.max_bytes and self._size + chunk_bytes > 0:
                self._write_lines(chunk)
                chunk, chunk_bytes = [], 0
                self._rotate()
            chunk.append(data)
            chunk_bytes += len(data)
        self._write_lines(chunk)

    def _write_lines(self, lines: list[bytes], *, count: bool = True) -> None:
        if not lines or self._fd is None:
            return
        try:
            view = memoryview(b"".join(lines))
            total = len(view)
            while view:
                view = view[os.write(self._fd, view):]
            self._size += total
        except OSError as e:  # counted, never raised into a request or the watchdog
            if count:
                self.dropped += len(lines)
            self.last_error = f"{type(e).__name__}: {e}"

    def _rotate(self) -> None:
        """LOG -> LOG.1 -> LOG.2 ... (the oldest beyond `backups` is replaced); a new LOG that opens with the meta
        record. On failure the old file is kept and the next flush tries again."""
        try:
            if not stat.S_ISREG(os.fstat(self._fd).st_mode):
                return  # a device or pipe: nothing to rotate
            if self.backups <= 0:
                os.ftruncate(self._fd, 0)
            else:
                for i in range(self.backups - 1, 0, -1):
                    older = self.path.with_name(f"{self.path.name}.{i}")
                    if older.exists():
                        os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
                os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
                fd, self._fd = self._fd, self._open()
                os.close(fd)
            self._size = 0
            self.rotations += 1
        except OSError as e:
            self.last_error = f"rotation failed: {type(e).__name__}: {e}"
            return
        if self._meta is not None:
            meta = {**self._meta, "rotated_from": f"{self.path.name}.1"}
            self._write_lines([(strict_dumps(meta, separators=(",", ":")) + "\n").encode()], count=False)

    def meta(self, **fields: Any) -> None:
        record = {"type": "meta", "format_version": LOG_FORMAT_VERSION, "t_s": time.time(), **fields}
        self._meta = record
        self.write(record, flush=True)

    @property
    def closed(self) -> bool:
        return self._fd is None

    def close(self) -> None:
        with self._lock:
            if self._fd is None:
                return
            self._flush_locked()
            try:
                os.fsync(self._fd)
            except OSError:  # a device or a full disk: what could be written was
                pass
            os.close(self._fd)
            self._fd = None

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


def _number(v: Any, optional: bool = True) -> bool:
    # finite: Python's json reads another writer's NaN / Infinity tokens as floats, and one such time or reading made
    # the report's "duration: nan s" and "power: mean nan W" (edgekit's own writers put null there)
    return (optional and v is None) or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))


def _numbers(d: Any, keys: tuple[str, ...] | None = None, *, optional: bool = True) -> bool:
    """``d`` is a mapping (or None) whose values under ``keys`` (all of them without keys) are numbers; null too
    where ``optional``."""
    if d is None:
        return True
    return isinstance(d, dict) and all(_number(v, optional) for k, v in d.items() if keys is None or k in keys)


# What `edgekit report` computes with (plots, maxima, formatted labels), so a number and never null: a writer's NaN is
# null on disk (strict JSON), and a window or a reading without one is not written at all
_QUANTILE_KEYS = ("p50_ms", "p95_ms", "p99_ms", "jitter_ms")
_EVIDENCE_KEYS = ("value_ms", "jitter_ms", "total_w", "temp_c", "centre_w")


def _latency_window(m: Any) -> bool:
    return (isinstance(m, dict) and all(_number(m.get(k), optional=False) for k in _QUANTILE_KEYS)
            and _number(m.get("n")) and _number(m.get("std_ms")))


def _well_formed(rec: dict[str, Any]) -> bool:
    """Whether the fields `edgekit report` reads have the types the writers give them: a line that is JSON but not
    such a record (hand-edited, from another tool) is skipped as a torn line is, not a traceback."""
    kind = rec.get("type")
    if kind == "meta":
        return isinstance(rec.get("policy"), (dict, type(None)))
    if not _number(rec.get("t_s"), optional=False):
        return False
    if kind == "sample":
        return (_numbers(rec.get("rails_mw"), optional=False) and _numbers(rec.get("temps_c"), optional=False)
                and all(_number(rec.get(k)) for k in ("total_mw", "rails_sum_mw", "gpu_load_pct", "cpu_load_pct"))
                and isinstance(rec.get("rails_sum_of"), (list, type(None))))
    if kind == "latency":
        metrics = rec.get("metrics")
        return ((metrics is None or isinstance(metrics, dict)) and all(map(_latency_window, (metrics or {}).values()))
                and isinstance(rec.get("measured_on"), (str, type(None))))
    if kind == "event":
        actions = rec.get("actions")
        return (isinstance(rec.get("kind", ""), str) and _numbers(rec.get("evidence"), _EVIDENCE_KEYS, optional=False)
                and (actions is None or (isinstance(actions, list) and all(isinstance(a, dict) for a in actions))))
    return True


def read_log(path: str | Path) -> LogContents:
    p = Path(path)
    if not p.is_file():
        what = "is a directory, not a log file" if p.is_dir() else "no such log file"
        raise EdgekitError(f"{p}: {what}", hint="pass the JSONL file written by `edgekit monitor --log`, the runtime's "
                                                "watchdog or serve (STORE/server.jsonl)")
    out = LogContents()
    buckets = {"meta": out.meta, "sample": out.samples, "latency": out.latency, "event": out.events}
    for n, rec in iter_records(p):
        if rec is None or rec.get("type") not in buckets or not _well_formed(rec):
            out.skipped_lines.append(n)
            continue
        buckets[rec["type"]].append(rec)
    return out
