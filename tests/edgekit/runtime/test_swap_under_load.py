"""Plugin swaps while serving: a real server on 127.0.0.1, concurrent clients, signed packages, no failed request."""

from __future__ import annotations

import statistics
import time

import pytest

from runtime_helpers import live_server, plugin_packages, write_admin_token

from edgekit.runtime.bundle_runtime import open_bundle
from edgekit.runtime.server import create_app
from edgekit.runtime.serving import ServingStack, open_store
from edgekit.runtime.swap_load import run_swap_load

pytestmark = pytest.mark.serial  # it times wall-clock behaviour: scripts/test.sh runs it alone, after the parallel phase

TOKEN = "load-test-admin-token-0123456789"


@pytest.fixture(scope="module")
def bundle_dir(tiny_bundle):
    return tiny_bundle


def _packages(bundle_dir, op: str, versions) -> list[bytes]:
    return plugin_packages(bundle_dir, op, versions)


@pytest.fixture()
def server(bundle_dir, tmp_path):
    b = open_bundle(bundle_dir, [], allow_dev_key=True, device="cpu", golden=False)
    store = open_store(tmp_path / "store", b, [], allow_dev_key=True)
    stack = ServingStack(b, store, max_waiting=8)
    tok = write_admin_token(tmp_path / "token", TOKEN)
    app = create_app(stack.engine, admin_token_file=str(tok), plugins=stack.admin)
    with live_server(app) as url:
        yield url, stack
    stack.close()


def test_swaps_under_load_drop_no_request(server, bundle_dir):
    url, stack = server
    packages = _packages(bundle_dir, "rmsnorm", range(2, 12))  # 10 swaps (the script runs 100)
    res = run_swap_load(url, TOKEN, packages, clients=3, max_tokens=3, max_seconds=240)
    d = res.to_dict()
    assert d["requests_failed"] == 0, d["failures"]
    assert d["swaps_ok"] == 10, d["swaps_failed"]
    assert res.requests_ok > 0
    assert stack.engine.table.sources()["rmsnorm"].startswith("plugin:v11")
    pauses = sorted(stack.engine.swap_pauses_s)
    assert statistics.median(pauses) < 0.005  # the switch itself: a pointer assignment


def test_refusals_change_nothing(server, bundle_dir):
    import httpx

    url, stack = server
    auth = {"Authorization": f"Bearer {TOKEN}"}
    good = _packages(bundle_dir, "rmsnorm", [5])[0]
    with httpx.Client(base_url=url, headers=auth, timeout=60) as c:
        assert c.post("/v1/plugins", files={"file": ("p.tar", good)}).status_code == 200
        before = stack.engine.table.sources()
        corrupted = bytearray(good)
        corrupted[len(corrupted) // 2] ^= 0xFF
        for pkg, why in ((bytes(corrupted), "corrupt"), (_packages(bundle_dir, "rmsnorm", [3])[0], "downgrade"),
                         (_packages(bundle_dir, "rmsnorm", [5])[0], "already")):
            r = c.post("/v1/plugins", files={"file": ("p.tar", pkg)})
            assert r.status_code == 422, (why, r.text)
        assert stack.engine.table.sources() == before
        assert c.post("/v1/plugins", files={"file": ("p.tar", good)}, headers={"Authorization": "Bearer nope"}).status_code == 401


def test_rollback_route_restores_the_bundle_plugin(server, bundle_dir):
    import httpx

    url, stack = server
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, headers=auth, timeout=60) as c:
        assert c.post("/v1/plugins", files={"file": ("p.tar", _packages(bundle_dir, "swiglu", [2])[0])}).status_code == 200
        assert stack.engine.table.sources()["swiglu"].startswith("plugin:v2")
        r = c.post("/v1/plugins/swiglu/rollback")
        assert r.status_code == 200, r.text
    assert stack.engine.table.sources()["swiglu"] == "reference"  # the bundle's own entry on a CPU


def test_faulty_operator_falls_back_and_the_request_succeeds(server):
    import httpx

    url, stack = server

    def broken(*args):
        raise RuntimeError("simulated launch failure")

    stack._install("swiglu", broken, "plugin:broken", fallback=None, probation=True)
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 3})
    assert r.status_code == 200
    assert any(e["kind"] == "operator_fault" and e["op"] == "swiglu" for e in stack.events)


def test_non_finite_output_is_isolated(server):
    import httpx
    import torch

    url, stack = server
    stack._install("rmsnorm", lambda x, w, eps: torch.full_like(x, float("nan")), "plugin:nan", fallback=None, probation=True)
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/v1/completions", json={"prompt": [4, 5, 6], "max_tokens": 3})
    assert r.status_code == 200
    assert any(e["kind"] == "operator_fault" and e["reason"] == "non-finite output" for e in stack.events)


def test_probation_rolls_back_a_slower_plugin(server, bundle_dir):
    import httpx

    from edgekit.runtime.serving import GuardedOp

    url, stack = server
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, timeout=60) as c:
        for _ in range(4):  # serving before the swap
            assert c.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 6}).status_code == 200
        assert c.post("/v1/plugins", files={"file": ("p.tar", _packages(bundle_dir, "rmsnorm", [2])[0])}, headers=auth).status_code == 200
        g = stack.engine.table.get("rmsnorm")
        assert isinstance(g, GuardedOp)
        fast = g.fn

        def slow(*a):
            time.sleep(0.004)  # 4 ms per call, 5 calls per token: far beyond the 10% slowdown budget
            return fast(*a)

        g.fn = slow
        for _ in range(60):  # until the A/B trial has enough step pairs for a verdict
            assert c.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 12}).status_code == 200
            stack.admin_worker.submit(lambda: None).result(30)
            if any(e["kind"] == "rollback" for e in stack.events):
                break
    kinds = [e["kind"] for e in stack.events]
    assert "probation_failed" in kinds and "rollback" in kinds
    assert stack.store.pointer("rmsnorm").version is None  # back to the bundle's plugin


def test_watchdog_sees_requests_and_its_actions_are_wired(bundle_dir, tmp_path):
    from fastapi.testclient import TestClient

    b = open_bundle(bundle_dir, [], allow_dev_key=True, device="cpu", golden=False)
    stack = ServingStack(b, open_store(tmp_path / "store", b, [], allow_dev_key=True))
    wd = stack.start_watchdog(sensors=[])
    try:
        c = TestClient(create_app(stack.engine, extra_registries=[wd.registry]))
        assert c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 4}).status_code == 200
        assert wd.tracker.count("token") >= 3 and wd.tracker.count("ttft") == 1
        assert "token_latency_seconds_bucket" in c.get("/metrics").text
        from edgekit.power.events import Event

        breach = Event(t_s=time.time(), kind="jitter", severity="critical", message="injected breach")
        results = wd.actions.run(breach, ["shed_load"])
        assert results and all(r.to_dict().get("ok", True) for r in results)
        assert c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2}).status_code == 429
    finally:
        wd.stop()
