"""Runtime test helpers: the fake package format (fakepkg.py) importable by tests and crash subprocesses."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import sys
import threading
import time
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


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory):
    """A signed fp16 bundle of the tiny preset (dev key) planned for 4 sequences at once, built once per session."""
    from edgekit.builder import BuildOptions, build_bundle

    d = tmp_path_factory.mktemp("tiny-bundle")
    opts = BuildOptions(model="preset:tiny", target="orin", out=d / "bundle", dev_key=True, precision="fp16",
                        context=64, buckets=(16, 32), batch=4, onnx=False, cache_dir=d / "cache")
    return build_bundle(opts).out


ADMIN_TOKEN = "attack-tests-admin-token-0123456789"


@pytest.fixture(scope="session")
def smol_engine(default_model):
    """The real default model (it has a tokenizer) behind an engine with small static shapes."""
    from edgekit.runtime.engine import Engine
    from edgekit.shapes import StaticShapes

    e = Engine(default_model.decoder(), default_model.tokenizer, StaticShapes(buckets=(32, 64), max_seq_len=96),
               stop_ids=default_model.config.eos_token_ids, max_waiting=4, model_name="smollm2-135m")
    yield e
    e.close()


@pytest.fixture()
def tiny_stack(tiny_bundle, tmp_path):
    """A serving stack (CPU) over the tiny bundle with its own plugin store, and a JSON-lines log."""
    from edgekit.power.jsonl import JsonlLogger
    from edgekit.runtime.bundle_runtime import open_bundle
    from edgekit.runtime.serving import ServingStack, open_store

    b = open_bundle(tiny_bundle, [], allow_dev_key=True, device="cpu", golden=False)
    store = open_store(tmp_path / "store", b, [], allow_dev_key=True)
    stack = ServingStack(b, store, max_waiting=8, log=JsonlLogger(tmp_path / "store" / "server.jsonl"))
    yield stack
    stack.close()


@pytest.fixture()
def tiny_server(tiny_stack, tmp_path):
    """(base URL, stack, admin headers) of a live loopback server over `tiny_stack`."""
    from edgekit.runtime.server import create_app

    tok = write_admin_token(tmp_path / "admin.token", ADMIN_TOKEN)
    app = create_app(tiny_stack.engine, admin_token_file=str(tok), plugins=tiny_stack.admin, log=tiny_stack.log)
    with live_server(app, header_timeout_s=1.0) as url:
        yield url, tiny_stack, {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def plugin_packages(bundle_dir: Path, op: str, versions) -> list[bytes]:
    """Signed (dev key) packages of the bundle's own plugin for `op`, relabelled with other versions."""
    from edgekit.bundle.keys import development_key
    from edgekit.bundle.plugin import pack_plugin, parse_plugin_metadata, plugin_files_from_dir

    d = bundle_dir / "plugins" / op / "1"
    meta = parse_plugin_metadata((d / "plugin.json").read_bytes())
    files = {k: v for k, v in plugin_files_from_dir(d).items() if k != "plugin.json"}
    return [pack_plugin(meta.model_copy(update={"version": v}), files, development_key()) for v in versions]
