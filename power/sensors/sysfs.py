"""Where sysfs is, and tolerant reads of its one-value files.

Every sysfs sensor takes a root so tests (and `edgekit monitor --sysfs-root`)
can point it at a recorded board layout. The root is the directory that plays
the part of ``/sys``; a recorded root file system (a directory that holds
``sys/``) is accepted too.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_SYSFS_ROOT = Path("/sys")


def resolve_root(root: str | Path | None) -> Path:
    """The directory that stands for /sys (``DIR`` or ``DIR/sys``)."""
    p = Path(root) if root is not None else DEFAULT_SYSFS_ROOT
    if not (p / "bus").exists() and not (p / "class").exists() and (p / "sys").is_dir():
        return p / "sys"
    return p


def read_text(path: Path) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read().strip()


def read_int(path: Path) -> int:
    """An integer sysfs value; a ValueError that names the file when it is not one."""
    text = read_text(path)
    try:
        return int(text.split()[0]) if text else int("")
    except ValueError as e:
        raise ValueError(f"{path}: expected an integer, read {text[:40]!r}") from e


class ValueFile:
    """A sysfs value file kept open and re-read with ``pread`` at offset 0.

    sysfs regenerates an attribute's text on every read from offset 0 (the
    documented way to re-read after poll), so one open file serves many reads:
    at a 100 Hz power sampling rate, open+read+close per value costs several
    times more CPU than one pread. On error the file is closed and reopened
    on the next read, and ``reopen_s`` bounds how long a handle is trusted, so
    a file replaced or removed underneath (a driver rebind, a recorded tree
    being edited) is seen within that time.
    """

    __slots__ = ("path", "reopen_s", "_fd", "_opened")

    def __init__(self, path: Path, reopen_s: float = 1.0):
        self.path = path
        self.reopen_s = reopen_s
        self._fd: int | None = None
        self._opened = 0.0

    def read_int(self, now: float) -> int:
        if self._fd is not None and now - self._opened >= self.reopen_s:
            self.close()
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
            self._opened = now
        try:
            raw = os.pread(self._fd, 64, 0)
        except OSError:
            self.close()
            raise
        text = raw.decode("ascii", errors="replace").strip()
        try:
            return int(text.split()[0]) if text else int("")
        except ValueError as e:
            raise ValueError(f"{self.path}: expected an integer, read {text[:40]!r}") from e

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
