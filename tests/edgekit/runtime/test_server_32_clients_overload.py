"""Attack 3: 32 clients at once on a small host. Before: requests queued in the default thread pool first, so the
waiting-room limit never triggered (p99 53 s, no 429) and a rollback waited 35 s behind inference.

Now: admission is its own bounded queue with a deadline, and admin work has its own thread. Here the device is
held on purpose (a stuck step), which is the worst case for both."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from runtime_helpers import plugin_packages

from edgekit.kernels.rmsnorm import rmsnorm_reference

pytestmark = pytest.mark.serial  # it times wall-clock behaviour: scripts/test.sh runs it alone, after the parallel phase


def test_32_clients_get_an_answer_or_a_429_fast_and_a_rollback_does_not_wait(tiny_server, tiny_bundle):
    url, stack, auth = tiny_server
    with httpx.Client(base_url=url, headers=auth, timeout=30) as admin:
        assert admin.post("/v1/plugins", files={"file": ("p.tar", plugin_packages(tiny_bundle, "swiglu", [2])[0])}).status_code == 200

    release = threading.Event()
    stuck = threading.Event()

    def held(x, w, eps):  # the device is inside a step that does not end until released (at most 8 s)
        stuck.set()
        release.wait(8)
        return rmsnorm_reference(x, w, eps)

    stack.engine.switch_operator("rmsnorm", held, "plugin:held")
    results: list[tuple[int, float, str | None]] = []

    def client() -> None:
        t = time.perf_counter()
        r = httpx.post(url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2}, timeout=30)
        results.append((r.status_code, time.perf_counter() - t, r.headers.get("retry-after")))

    try:
        with ThreadPoolExecutor(32) as pool:
            futures = [pool.submit(client) for _ in range(32)]
            assert stuck.wait(10)
            t = time.perf_counter()
            with httpx.Client(base_url=url, headers=auth, timeout=30) as admin:
                r = admin.post("/v1/plugins/swiglu/rollback")
            rollback_s = time.perf_counter() - t
            time.sleep(1.5)  # every waiter's deadline (0.5 s) has passed
            refused = [x for x in results if x[0] == 429]
            release.set()
            for f in futures:
                f.result(timeout=30)
    finally:
        release.set()
    assert r.status_code == 200, r.text
    # waiting behind the held step would take its full 8 s; 3 s leaves room for a loaded CI machine (the 1 s goal
    # itself is measured by scripts/load_serve.py, not by a timed unit test: this failed at 1.005 and 1.48 s under load)
    assert rollback_s < 3.0, f"the rollback took {rollback_s:.2f} s with the device held (the step holds it 8 s)"
    assert stack.engine.table.sources()["swiglu"] == "reference"
    statuses = sorted({s for s, _, _ in results})
    assert set(statuses) <= {200, 429}, statuses
    # everything but the one request inside the held step (and at most a few in rows behind it) was refused
    # within its deadline, with Retry-After
    assert len(refused) >= 32 - len(stack.engine._rows)
    assert all(ra == "1" and dt < 3.0 for _, dt, ra in refused), refused


def test_a_flood_is_refused_before_its_bodies_are_parsed(tiny_server, monkeypatch):
    url, stack, _ = tiny_server
    monkeypatch.setattr(stack.engine, "max_waiting", -len(stack.engine._rows))  # as full as it gets
    r = httpx.post(url + "/v1/completions", content=b"{not json at all", headers={"Content-Type": "application/json"},
                   timeout=10)
    assert r.status_code == 429 and r.headers["retry-after"] == "1"  # not a 400: the body was never read
    assert httpx.get(url + "/healthz", timeout=10).status_code == 200  # only inference routes are refused
