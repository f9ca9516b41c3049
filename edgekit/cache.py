"""A content-addressed cache for build stages: same inputs, same key, no recomputation.

A key is the sha256 of a canonical JSON description of everything that
changes a stage's output (input hashes, options, tool versions). An entry is a
directory of files written atomically (staged in a temp dir, then renamed), so
a crash never leaves a half entry that a later build would trust. The cache
holds only what this machine produced; it is never shared or downloaded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from edgekit.kernels.aot import content_key


def default_cache_dir() -> Path:
    return Path(os.environ.get("EDGEKIT_CACHE_DIR") or Path.home() / ".cache" / "edgekit")


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

    def _entry(self, stage: str, key: str) -> Path:
        return self.root / stage / key[:2] / key

    def get(self, stage: str, key: str) -> dict[str, bytes] | None:
        """All files of an entry, or None on a miss."""
        if not self.enabled:
            return None
        d = self._entry(stage, key)
        if not (d / ".complete").exists():
            self.misses.append(stage)
            return None
        self.hits.append(stage)
        return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != ".complete"}

    def put(self, stage: str, key: str, files: dict[str, bytes | Path]) -> None:
        if not self.enabled:
            return
        final = self._entry(stage, key)
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
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # a cache that cannot be written only costs time
