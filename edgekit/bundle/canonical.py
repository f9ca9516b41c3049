"""Canonical bytes, hashes and safe relative paths: the ground every signature stands on.

A signature covers exact bytes, so every signed JSON document is serialized one
way only: keys sorted, no insignificant whitespace, UTF-8, no NaN/Infinity.
Same object -> same bytes -> same hash, on every machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any, BinaryIO

# Writing files is not this module's job (edgekit.durable holds the one atomic-write helper); the name stays
# importable from here for callers written before it moved.
from edgekit.durable import replace_atomically as atomic_write_bytes  # noqa: F401

HEX64 = r"^[0-9a-f]{64}$"
_HEX64_RE = re.compile(HEX64)

# Names in bundles and packages: lower-case letters, digits, underscores, dots and
# dashes per path component. Deliberately narrow: no spaces, no backslashes, no
# Unicode look-alikes, nothing a shell or a case-insensitive file system mangles.
# Always .fullmatch: with .match, `$` also accepts a final "\n" ("model.onnx\n").
_COMPONENT_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
MAX_PATH_CHARS = 255
MAX_PATH_DEPTH = 8


def canonical_json(obj: Any) -> bytes:
    """The one serialization of a JSON document that gets hashed or signed."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_stream(f: BinaryIO, chunk_bytes: int = 1 << 20) -> tuple[str, int]:
    """(sha256 hex, size) of a file object, read in chunks so weights never sit in memory whole."""
    h = hashlib.sha256()
    size = 0
    while chunk := f.read(chunk_bytes):
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size


def sha256_file(path: str | os.PathLike) -> tuple[str, int]:
    with open(path, "rb") as f:
        return sha256_stream(f)


def is_sha256_hex(s: str) -> bool:
    return bool(_HEX64_RE.fullmatch(s))


def relpath_problem(path: str) -> str | None:
    """Why `path` is not a safe relative POSIX path inside a bundle, or None if it is.

    Refuses what could escape the bundle directory or alias another file:
    absolute paths, `..`, `.`, empty components, backslashes, odd characters.
    """
    if not isinstance(path, str) or not path:
        return "empty path"
    if len(path) > MAX_PATH_CHARS:
        return f"path longer than {MAX_PATH_CHARS} characters"
    if path.startswith("/") or re.match(r"^[A-Za-z]:", path):
        return "absolute path"
    if "\\" in path:
        return "backslash in path (only '/' separates components)"
    parts = path.split("/")
    if ".." in parts:
        return "'..' component (would escape the bundle)"
    if len(parts) > MAX_PATH_DEPTH:
        return f"more than {MAX_PATH_DEPTH} path components"
    for part in parts:
        if part in ("", "."):
            return "empty or '.' path component"
        if not _COMPONENT_RE.fullmatch(part):
            return f"component {part!r} has characters outside [A-Za-z0-9_.-] or starts with '.' or '-'"
    return None
