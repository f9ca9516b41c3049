"""Attack 4: a restart while a plugin is on probation, and a typo in --admin-token-file.

Before: both rolled a healthy plugin back at the next start and blocked its version for good.
Now: a clean stop records the probation's progress and the next start resumes it; only a runtime that died
during probation rolls the plugin back. The token file is checked before the store's start-up recovery."""

from __future__ import annotations

import httpx

from runtime_helpers import plugin_packages

from edgekit.runtime.bundle_runtime import open_bundle
from edgekit.runtime.serving import ServingStack, open_store


def _stack(bundle_dir, store_dir):
    b = open_bundle(bundle_dir, [], allow_dev_key=True, device="cpu", golden=False)
    return ServingStack(b, open_store(store_dir, b, [], allow_dev_key=True))


def _left_on_probation(bundle_dir, store_dir, requests: int):
    """A stack that installed swiglu v2 and served `requests` requests on it, then stopped without a clean stop
    (as after kill -9); returns it (its engine is closed)."""
    stack = _stack(bundle_dir, store_dir)
    stack.admin.install(plugin_packages(bundle_dir, "swiglu", [2])[0])
    _serve_requests(stack, requests)
    stack.engine.close()
    stack.store.close()  # the kernel drops a killed server's claim on the store (an flock)
    return stack


def _serve_requests(stack, n: int) -> None:
    for _ in range(n):
        stack.engine.complete([1, 2, 3], 24)  # enough decode steps on both arms of the A/B trial for a verdict
    stack.admin_worker.submit(lambda: None).result(10)  # the probation bookkeeping has been written


def test_clean_restart_resumes_probation_where_it_stopped(tiny_bundle, tmp_path):
    store_dir = tmp_path / "store"
    stack = _stack(tiny_bundle, store_dir)
    stack.admin.install(plugin_packages(tiny_bundle, "swiglu", [2])[0])
    _serve_requests(stack, 3)
    stack.close()  # what SIGTERM does (serve calls it when uvicorn returns)
    p = stack.store.pointer("swiglu")
    assert (p.version, p.state, p.clean_stop, p.probation_requests) == ("2", "probation", True, 3)

    again = _stack(tiny_bundle, store_dir)
    try:
        p = again.store.pointer("swiglu")
        assert (p.version, p.state, p.clean_stop) == ("2", "probation", False)  # not rolled back, not blocked
        assert "2" not in p.blocked and any("resumes probation" in line for line in again.store.recovery)
        assert again._probation["swiglu"].requests == 3
        _serve_requests(again, again.policy.requests - 3)  # the verdict is due from here on
        for _ in range(40):  # until the A/B trial has enough step pairs to decide
            if again.store.pointer("swiglu").state == "confirmed":
                break
            _serve_requests(again, 1)
        assert again.store.pointer("swiglu").state == "confirmed", again.events[-3:]
    finally:
        again.close()


def test_a_runtime_that_died_during_probation_rolls_the_plugin_back(tiny_bundle, tmp_path):
    store_dir = tmp_path / "store"
    _left_on_probation(tiny_bundle, store_dir, 2)
    again = _stack(tiny_bundle, store_dir)
    try:
        p = again.store.pointer("swiglu")
        assert p.version is None and "2" in p.blocked
    finally:
        again.close()


def test_token_file_typo_fails_before_the_store_is_touched(tiny_bundle, tmp_path):
    import subprocess
    import sys

    store_dir = tmp_path / "store"
    _left_on_probation(tiny_bundle, store_dir, 0)  # a start would roll it back
    before = (store_dir / "ops" / "swiglu" / "active").read_bytes()
    r = subprocess.run([sys.executable, "-m", "edgekit", "serve", str(tiny_bundle), "--allow-dev-key", "--store",
                        str(store_dir), "--admin-token-file", str(tmp_path / "admin.tokn"), "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "admin.tokn" in r.stderr and "no such file" in r.stderr and "Traceback" not in r.stderr
    assert (store_dir / "ops" / "swiglu" / "active").read_bytes() == before


def test_sigterm_of_a_real_server_keeps_the_probation(tiny_bundle, tmp_path):
    """The whole path: `edgekit serve` in a subprocess, an upload, SIGTERM, the pointer afterwards."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    from runtime_helpers import write_admin_token

    token = "sigterm-test-admin-token-0123456789"
    tok = write_admin_token(tmp_path / "admin.token", token)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store_dir = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, "-m", "edgekit", "serve", str(tiny_bundle), "--allow-dev-key", "--store",
                             str(store_dir), "--admin-token-file", str(tok), "--port", str(port), "--no-watchdog"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        auth = {"Authorization": f"Bearer {token}"}
        r = httpx.post(url + "/v1/plugins", headers=auth, files={"file": ("p.tar", plugin_packages(tiny_bundle, "swiglu", [2])[0])}, timeout=60)
        assert r.status_code == 200, r.text
        assert httpx.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2}, timeout=30).status_code == 200
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, out.decode()[-2000:]
    import json

    p = json.loads((store_dir / "ops" / "swiglu" / "active").read_text())
    assert (p["version"], p["state"], p["clean_stop"]) == ("2", "probation", True)
    log = [json.loads(line) for line in (store_dir / "server.jsonl").read_text().splitlines()]
    assert any(r.get("type") == "request" and r.get("route") == "plugins" and r.get("action") == "install" for r in log)
    assert any(r.get("type") == "request" and r.get("route") == "completions" for r in log)


def test_a_resumed_probation_keeps_its_trial_when_another_operator_is_switched_at_start(tiny_bundle, tmp_path):
    """At start-up every operator's active plugin is switched in; a switch ends the running A/B trial. A probation
    resumed before a confirmed operator's switch (here attention_decode before swiglu, in name order) had its trial
    ended at once and collected no step pairs: versions on probation are now switched last."""
    store_dir = tmp_path / "store"
    stack = _stack(tiny_bundle, store_dir)
    stack.admin.install(plugin_packages(tiny_bundle, "swiglu", [2])[0])
    stack.admin.confirm("swiglu")
    with stack._lock:
        stack._probation.pop("swiglu", None)
    stack.admin.install(plugin_packages(tiny_bundle, "attention_decode", [2])[0])
    stack.close()

    again = _stack(tiny_bundle, store_dir)
    try:
        assert again.store.pointer("swiglu").state == "confirmed"
        p = again._probation["attention_decode"]
        again.policy.requests = 10_000  # no verdict: only the pairs are read
        _serve_requests(again, 3)
        assert sum(len(v) for v in again.engine.trial_pairs(p.trial).values()) > 0
    finally:
        again.close()
