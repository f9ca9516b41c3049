"""Runtime test helpers that test modules import by name (`from runtime_helpers import ...`).

They live outside conftest.py on purpose: `from conftest import X` resolves to whichever conftest module Python
imported first, so a worker that had run tests/edgekit/quant (its own conftest) could not collect these tests.
A module with its own name, found through the path the runtime conftest adds (as fakepkg.py is), cannot clash.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from pathlib import Path

ADMIN_TOKEN = "attack-tests-admin-token-0123456789"


def tree_digest(root: Path) -> dict[str, str]:
    """Every path under `root` (except the lock file) with a hash of its bytes: 'nothing changed' == equal digests."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if rel == ".lock":
            continue
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def write_admin_token(path: Path, token: str) -> Path:
    """An admin token file as the server requires it: owner-only (0600)."""
    path.write_text(token)
    path.chmod(0o600)
    return path


@contextlib.contextmanager
def live_server(app, **kw):
    """The app on 127.0.0.1 (ephemeral port) with the production uvicorn settings; yields the base URL."""
    from edgekit.runtime.http_guard import make_uvicorn_server

    srv = make_uvicorn_server(app, "127.0.0.1", 0, **kw)
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    for _ in range(400):
        if srv.started:
            break
        time.sleep(0.025)
    assert srv.started, "the test server did not start"
    try:
        yield f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}"
    finally:
        srv.should_exit = True
        th.join(10)


def plugin_packages(bundle_dir: Path, op: str, versions) -> list[bytes]:
    """Signed (dev key) packages of the bundle's own plugin for `op`, relabelled with other versions."""
    from edgekit.bundle.keys import development_key
    from edgekit.bundle.plugin import pack_plugin, parse_plugin_metadata, plugin_files_from_dir

    d = bundle_dir / "plugins" / op / "1"
    meta = parse_plugin_metadata((d / "plugin.json").read_bytes())
    files = {k: v for k, v in plugin_files_from_dir(d).items() if k != "plugin.json"}
    return [pack_plugin(meta.model_copy(update={"version": v}), files, development_key()) for v in versions]
