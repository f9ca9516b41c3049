"""Attack 5: another process holds the plugin store's lock (an agent mid-install, or a hostile local user).

Before: an inference request that ended a probation waited for the lock, then failed with a 400 that printed
the store path. Now: inference never takes the store lock (probation decisions run on the admin worker),
and an admin request that times out on the lock answers without the path."""

from __future__ import annotations

import fcntl
import os

import httpx

from runtime_helpers import plugin_packages

import edgekit.runtime.plugin_store as plugin_store


def test_inference_is_served_while_the_store_lock_is_held(tiny_server, tiny_bundle, monkeypatch):
    url, stack, auth = tiny_server
    monkeypatch.setattr(plugin_store, "LOCK_TIMEOUT_S", 0.5)
    with httpx.Client(base_url=url, timeout=30) as c:
        assert c.post("/v1/plugins", headers=auth, files={"file": ("p.tar", plugin_packages(tiny_bundle, "swiglu", [2])[0])}).status_code == 200
        fd = os.open(stack.store.root / ".lock", os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held by "someone else" for the whole probation and beyond
        try:
            replies = [c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 24})  # steps for a verdict
                       for _ in range(stack.policy.requests + 2)]
            stack.admin_worker.submit(lambda: None).result(30)  # the worker tried (and failed) to confirm
            r = c.post("/v1/plugins/swiglu/rollback", headers=auth)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
    assert [x.status_code for x in replies] == [200] * len(replies)
    assert any(e["kind"] == "confirm_failed" for e in stack.events)  # kept on probation; a restart resumes it
    assert r.status_code == 503 and r.headers["retry-after"] and str(stack.store.root) not in r.text
    assert stack.store.pointer("swiglu").state == "probation"
