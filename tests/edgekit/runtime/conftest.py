"""Runtime test fixtures. Helpers that tests import by name: runtime_helpers.py; the fake package format: fakepkg.py."""

from __future__ import annotations

import functools
import http.server
import sys
import threading
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from runtime_helpers import ADMIN_TOKEN, live_server, write_admin_token  # noqa: E402 (needs the path above)


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


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory):
    """A signed fp16 bundle of the tiny preset (dev key) planned for 4 sequences at once, built once per session."""
    from edgekit.builder import BuildOptions, build_bundle

    d = tmp_path_factory.mktemp("tiny-bundle")
    opts = BuildOptions(model="preset:tiny", target="orin", out=d / "bundle", dev_key=True, precision="fp16",
                        context=64, buckets=(16, 32), batch=4, onnx=False, cache_dir=d / "cache")
    return build_bundle(opts).out


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
