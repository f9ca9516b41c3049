"""Runtime test helpers: the fake package format (fakepkg.py) importable by tests and crash subprocesses."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


def tree_digest(root: Path) -> dict[str, str]:
    """Every path under `root` (except the lock file) with a hash of its bytes: 'nothing changed' == equal digests."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if rel == ".lock":
            continue
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out
