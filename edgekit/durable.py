"""Durable file operations: fsync'd writes, atomic replace, directory sync (plugin store, bundles, caches).

POSIX gives one atomic primitive, rename(2) within a file system: a reader sees
the old name or the new one, never a half-written file. Durability needs more:
the new file's bytes must be fsync'd before the rename, and the directory
holding the entry must be fsync'd after it, or a power cut can resurrect the old
entry (or an empty file). These helpers do exactly that, and take an optional
``between`` hook so crash tests can kill the process after the temp file is
complete but before the rename.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import Callable, Iterable


def fsync_dir(path: str | os.PathLike) -> None:
    """Make creations, renames and deletions inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_new_file(path: str | os.PathLike, data: bytes | Iterable[bytes], mode: int = 0o644) -> None:
    """Create `path` (must not exist) with `data` (bytes, or chunks of bytes), fsync'd, with exactly `mode`.

    Used inside staging directories, and for the temp file of every atomic replace.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have narrowed it; the mode is part of the contract (keys: 0o600)
        for chunk in ((data,) if isinstance(data, (bytes, bytearray, memoryview)) else data):
            view = memoryview(chunk)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(final: Path) -> Path:
    """A temp name next to `final` (same directory => same file system => rename is atomic).

    Starts with '.' and ends with '.tmp' so start-up recovery can recognise and delete it.
    """
    return final.with_name(f".{final.name}.{secrets.token_hex(4)}.tmp")


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def replace_atomically(
    path: str | os.PathLike, data: bytes | Iterable[bytes], *, between: Callable[[], None] | None = None, mode: int = 0o644
) -> None:
    """Replace `path` with `data`: temp file in the same dir, fsync file, rename, fsync dir.

    After a crash at any point the file holds the old bytes or the new bytes, never a mix;
    a stray temp file may remain and is the caller's to clean up at start-up.
    """
    final = Path(path)
    tmp = temp_name(final)
    try:
        write_new_file(tmp, data, mode)
        if between is not None:
            between()
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(final.parent)


def remove_tree_atomically(path: Path) -> None:
    """Make a directory disappear in one step (rename to a temp name), then delete it.

    A crash during the delete leaves only a temp-named directory, which recovery removes;
    never a half-deleted directory under its real name.
    """
    doomed = temp_name(path)
    os.rename(path, doomed)
    fsync_dir(path.parent)
    shutil.rmtree(doomed)


def remove_leftover(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
