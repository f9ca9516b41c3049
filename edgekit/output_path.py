"""Can this command write where it was told to? Asked before any work, answered in one line.

A build ran 6 minutes and then died with a traceback on an unwritable ``-o``; the same held for every
command that writes (keys, reports, packages, logs, a TUF repository). ``check_output_path`` is called
first thing: it finds the nearest part of the path that exists and proves it can be written by creating
(and removing) a temp file there, which also catches what permission bits cannot show (read-only file
systems, /proc, root squashing).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from edgekit.errors import OutputPathError


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _probe_writable(directory: Path) -> OSError | None:
    try:
        fd, name = tempfile.mkstemp(prefix=".edgekit-write-check-", dir=directory)
    except OSError as e:
        return e
    os.close(fd)
    os.unlink(name)
    return None


def check_output_path(path: str | os.PathLike, flag: str, *, kind: str = "file") -> Path:
    """Refuse, in one line, a ``kind`` ("file" or "dir") output ``path`` this process cannot create or replace.

    ``flag`` names the option as the user typed it (``-o``, ``--log``, ...). Returns the path.
    Missing parent folders are fine (they are created) as long as the nearest existing one is writable."""
    p = Path(path)
    if p.exists():
        if kind == "dir" and not p.is_dir():
            raise OutputPathError(f"{flag} {p}: is a file, expected a directory",
                                  hint="pass a directory path (it is created if missing)")
        if kind == "file" and p.is_dir():
            raise OutputPathError(f"{flag} {p}: is a directory, expected a file path",
                                  hint=f"pass a file name, e.g. {p / 'out'}")
    base = p if p.is_dir() else _nearest_existing(p.parent)
    if not base.is_dir():
        raise OutputPathError(f"{flag} {p}: {base} is a file, not a directory, so nothing can be created under it",
                              hint="choose a path whose folders are directories")
    problem = _probe_writable(base)
    if problem is not None:
        why = problem.strerror or type(problem).__name__
        raise OutputPathError(f"{flag} {p}: cannot write in {base} ({why})",
                              hint="choose a location this user can write, or fix the folder's permissions")
    return p
