"""Runtime test helpers: the fake package format (fakepkg.py) importable by tests and crash subprocesses."""

from __future__ import annotations

import functools
import hashlib
import http.server
import sys
import threading
from pathlib import Path

import pytest

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


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep test output clean
        pass


@pytest.fixture
def served(tmp_path):
    """(repo dir, base URL) for a static HTTP server on 127.0.0.1 with an ephemeral port."""
    repo = tmp_path / "repo"
    repo.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(repo)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield repo, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
