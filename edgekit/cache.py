"""A content-addressed cache for build stages: same inputs, same key, no recomputation.

A key is the sha256 of a canonical JSON description of everything that
changes a stage's output (input hashes, options, tool versions). An entry is a
directory of files written atomically (staged in a temp dir, then renamed), so
a crash never leaves a half entry that a later build would trust. The cache
holds only what this machine produced; it is never shared or downloaded.

Every build keys its entries by the code that made them, so each edgekit
version or model adds new ones: unbounded, the cache filled a disk (9 GB in a
few weeks of development). After a build the least recently used entries go
until the cache fits its limit (5 GiB, EDGEKIT_CACHE_MAX_GB to change it);
what this build used is never removed.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from edgekit.errors import ConfigError
from edgekit.kernels.aot import content_key

DEFAULT_MAX_GB = 5.0
STALE_TEMP_S = 3600.0  # a staging folder this old belongs to a build that crashed (a live one renames it in seconds)


def default_cache_dir() -> Path:
    return Path(os.environ.get("EDGEKIT_CACHE_DIR") or Path.home() / ".cache" / "edgekit")


def cache_limit_bytes() -> int:
    """The cache's size limit: EDGEKIT_CACHE_MAX_GB (gibibytes, 0 keeps only what the current build used)."""
    raw = os.environ.get("EDGEKIT_CACHE_MAX_GB")
    if raw is None:
        return int(DEFAULT_MAX_GB * 2**30)
    try:
        gb = float(raw)
    except ValueError:
        gb = math.nan
    if not (math.isfinite(gb) and gb >= 0):
        raise ConfigError(f"EDGEKIT_CACHE_MAX_GB={raw!r} is not a size in GiB",
                          hint=f"set a number >= 0 such as {DEFAULT_MAX_GB:g}, or unset it for the default")
    return int(gb * 2**30)


@dataclass(frozen=True)
class PruneResult:
    removed: int  # entries (and crashed builds' staging folders) deleted
    freed_bytes: int
    kept_bytes: int
    limit_bytes: int

    def to_dict(self) -> dict:
        return {"removed": self.removed, "freed_bytes": self.freed_bytes, "kept_bytes": self.kept_bytes,
                "limit_bytes": self.limit_bytes}


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


cache_key = content_key  # one canonical-JSON sha256 for every stage (kernels.aot keys its compiles the same way)


def package_source_hash(*packages: str) -> str:
    """sha256 over the .py files of packages: a cached result is stale once the code that made it changes."""
    import importlib

    h = hashlib.sha256()
    for package in packages:
        root = Path(importlib.import_module(package).__file__).parent
        for f in sorted(root.glob("*.py")):
            h.update(package.encode() + b"/" + f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


class BuildCache:
    def __init__(self, root: Path | None, enabled: bool = True):
        self.root = (root or default_cache_dir()) / "v1"
        self.enabled = enabled
        self.hits: list[str] = []
        self.misses: list[str] = []
        self._used: set[Path] = set()  # entries this instance read or wrote: prune keeps them

    def _entry(self, stage: str, key: str) -> Path:
        return self.root / stage / key[:2] / key

    def get(self, stage: str, key: str) -> dict[str, bytes] | None:
        """All files of an entry, or None on a miss."""
        if not self.enabled:
            return None
        d = self._entry(stage, key)
        try:
            os.utime(d / ".complete")  # the entry's last use: prune removes the least recently used first
            files = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != ".complete"}
            if not (d / ".complete").exists():  # another build's prune removed it while it was read
                raise FileNotFoundError(d)
        except OSError:  # no entry, or one removed under us: recompute (a cache only ever saves time)
            self.misses.append(stage)
            return None
        self.hits.append(stage)
        self._used.add(d)
        return files

    def put(self, stage: str, key: str, files: dict[str, bytes | Path]) -> None:
        if not self.enabled:
            return
        final = self._entry(stage, key)
        self._used.add(final)
        if (final / ".complete").exists():
            return
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=final.parent))
        try:
            for name, content in files.items():
                if isinstance(content, Path):
                    shutil.copyfile(content, tmp / name)
                else:
                    (tmp / name).write_bytes(content)
            (tmp / ".complete").write_bytes(b"")
            if final.exists():  # an incomplete leftover from a crash
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException as e:  # Ctrl-C included: no staging folder is left behind
            shutil.rmtree(tmp, ignore_errors=True)
            if not isinstance(e, OSError):
                raise
            # a cache that cannot be written only costs time

    def prune(self, limit_bytes: int | None = None) -> PruneResult:
        """Remove the least recently used entries until the cache fits `limit_bytes` (default: cache_limit_bytes()).

        Entries this instance used stay, even over the limit: the next identical build must hit. A folder that
        cannot be removed is skipped (pruning only ever costs a later build some time).
        """
        limit = cache_limit_bytes() if limit_bytes is None else limit_bytes
        if not self.enabled or not self.root.is_dir():
            return PruneResult(0, 0, 0, limit)
        removed = freed = 0
        entries = []  # (last use, bytes, folder) of entries prune may remove
        kept = 0
        for bucket in self.root.glob("*/*"):
            for d in bucket.iterdir() if bucket.is_dir() else ():
                if not d.is_dir():
                    continue
                size = _tree_bytes(d)
                done = d / ".complete"
                if done.exists():
                    if d in self._used:
                        kept += size
                    else:
                        entries.append((done.stat().st_mtime, size, d))
                elif d.name.startswith(".") and time.time() - d.stat().st_mtime > STALE_TEMP_S:
                    removed, freed = removed + 1, freed + size
                    shutil.rmtree(d, ignore_errors=True)
        total = kept + sum(size for _, size, _ in entries)
        for _, size, d in sorted(entries, key=lambda e: e[0]):
            if total <= limit:
                break
            shutil.rmtree(d, ignore_errors=True)
            if not d.exists():
                removed, freed, total = removed + 1, freed + size, total - size
        return PruneResult(removed, freed, total, limit)
