"""Where sysfs is, and tolerant reads of its one-value files.

Every sysfs sensor takes a root so tests (and `edgekit monitor --sysfs-root`)
can point it at a recorded board layout. The root is the directory that plays
the part of ``/sys``; a recorded root file system (a directory that holds
``sys/``) is accepted too.
"""

from __future__ import annotations

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
