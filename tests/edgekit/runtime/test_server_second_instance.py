"""#32 row 6 and #33 item 7: a second `edgekit serve` on the same store, and `serve` on a port already in use.

Before: the second server ran the store's start-up recovery before it bound its port: it rolled back, blocked
and deleted the plugin the first server was still serving on probation; a busy port was found only after the
whole model load, after a "serving ... on ..." line, as uvicorn's traceback-free error with exit 3.
Now: the port is bound, then the store claimed (an exclusive flock the kernel drops if the server dies), before
anything loads or recovers; either refusal is one line and exit 2, and the store is untouched."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

import httpx
import pytest

from runtime_helpers import plugin_packages, tree_digest


def _serve(bundle, store, port: int, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgekit", "serve", str(bundle), "--allow-dev-key", "--store",
                           str(store), "--port", str(port), "--no-watchdog"], capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})


def _one_line_error(r: subprocess.CompletedProcess) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in r.stderr and "serving" not in r.stderr + r.stdout, r.stderr
    return lines[0]


def test_a_second_serve_on_the_same_store_exits_with_a_clear_error_and_touches_nothing(tiny_server, tiny_bundle):
    url, stack, auth = tiny_server
    r = httpx.post(url + "/v1/plugins", headers=auth, timeout=60,
                   files={"file": ("p.tar", plugin_packages(tiny_bundle, "swiglu", [2])[0])})
    assert r.status_code == 200, r.text
    before = tree_digest(stack.store.root / "ops")
    line = _one_line_error(_serve(tiny_bundle, stack.store.root, 0))
    assert "in use" in line and str(os.getpid()) in line, line
    assert tree_digest(stack.store.root / "ops") == before
    p = stack.store.pointer("swiglu")
    assert (p.version, p.state, p.blocked) == ("2", "probation", ())
    assert httpx.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2}, timeout=30).status_code == 200


def test_serve_on_a_busy_port_exits_2_with_one_line_before_touching_the_store(tiny_bundle, tmp_path):
    from edgekit.runtime.bundle_runtime import open_bundle
    from edgekit.runtime.serving import ServingStack, open_store

    # a plugin left on probation by a server that died: a recovery would roll it back
    b = open_bundle(tiny_bundle, [], allow_dev_key=True, device="cpu", golden=False)
    store_dir = tmp_path / "store"
    stack = ServingStack(b, open_store(store_dir, b, [], allow_dev_key=True))
    stack.admin.install(plugin_packages(tiny_bundle, "swiglu", [2])[0])
    stack.engine.close()
    stack.store.close()  # what the kernel does for a server killed with -9: its claim on the store is gone
    before = tree_digest(store_dir / "ops")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = _one_line_error(_serve(tiny_bundle, store_dir, port))
    assert str(port) in line and "in use" in line, line
    assert tree_digest(store_dir / "ops") == before


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_the_url_serve_prints_for_an_ipv6_host_is_one_a_client_can_open(tiny_bundle, tmp_path):
    """`serve --host ::1` said "on http://::1:8000", which no client can open; the URL takes brackets."""
    p = subprocess.Popen([sys.executable, "-m", "edgekit", "serve", str(tiny_bundle), "--allow-dev-key", "--store",
                          str(tmp_path / "store"), "--host", "::1", "--port", "0", "--no-watchdog"],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    try:
        line = next((x for x in p.stderr if x.startswith("serving ")), "")
        url = re.search(r" on (\S+)", line).group(1)
        assert url.startswith("http://[::1]:"), line
        assert httpx.get(url + "/healthz", timeout=30).status_code == 200
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
