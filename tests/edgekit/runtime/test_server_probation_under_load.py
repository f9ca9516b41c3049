"""#32 row 5 and #33 item 2: probation that load cannot fool, and a watchdog that can roll a plugin back.

Before: probation compared per-token latency after a swap with the window before it, so 32 ordinary clients
(p50 120 -> 225 ms, jitter 42 -> 958 ms) rolled back an identical, healthy plugin and blocked it for good; and the
server registered its watchdog action as ``rollback_probation`` while the policy raises ``rollback_plugin``, so a
jitter event on a plugin on probation was logged "not_registered" and nothing happened.
Now: a plugin on probation runs an A/B trial (decode steps alternate with the table it replaced, same load, same
batch sizes); a latency verdict rolls back without blocking; the watchdog's rollback_plugin action asks the trial."""

from __future__ import annotations

import json
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import httpx
import pytest

from runtime_helpers import plugin_packages

from edgekit.kernels.swiglu import swiglu_reference
from edgekit.power.policy import PolicyConfig
from edgekit.runtime.swap_load import run_clients

pytestmark = pytest.mark.serial  # it times wall-clock behaviour: scripts/test.sh runs it alone, after the parallel phase

LOAD_S = 40.0


def _slowed(extra_s: float):
    def swiglu_slower(x):  # the same math, and a fixed extra time per call (as a slower kernel)
        time.sleep(extra_s)
        return swiglu_reference(x)
    return swiglu_slower


def _under_load(url: str, stack, seconds: float, until, at_least_s: float = 0.0) -> list[dict]:
    """32 careless clients (they retry a 429 at once) in another process, for at least `at_least_s`, then until
    `until()` or `seconds` pass. The clients stop once `until()` holds (the verdict lands within seconds; the load
    ran the whole 40 s window before, each of these tests waiting ~35 s after its verdict)."""
    ctx = get_context("spawn")
    with ctx.Manager() as manager, ProcessPoolExecutor(1, mp_context=ctx) as pool:
        stop = manager.Event()
        load = pool.submit(run_clients, url, {"prompt": [1, 2, 3, 4], "max_tokens": 16}, clients=32, seconds=seconds,
                           stop=stop)
        start = time.monotonic()
        while time.monotonic() < start + seconds and (time.monotonic() < start + at_least_s or not until()):
            time.sleep(0.2)
        stop.set()
        records = load.result(timeout=seconds + 120)
    stack.admin_worker.submit(lambda: None).result(30)  # a verdict's store write and event, if one was under way
    return records


def _decided(stack, op: str):
    return lambda: op not in stack._probation and stack.store.pointer(op).state != "probation"


@pytest.fixture()
def watched(tiny_server):
    url, stack, auth = tiny_server
    stack.start_watchdog(PolicyConfig(), sensors=[])  # the default budgets: 5 ms of token jitter
    yield url, stack, auth


def test_an_identical_plugin_passes_probation_under_32_clients_ignoring_retry_after(watched, tiny_bundle):
    url, stack, auth = watched
    with httpx.Client(base_url=url, timeout=30) as c:  # a quiet device before the update, as in the attack
        for _ in range(10):
            assert c.post("/v1/completions", json={"prompt": [1, 2, 3, 4], "max_tokens": 16}).status_code == 200
    r = httpx.post(url + "/v1/plugins", headers=auth, timeout=60,
                   files={"file": ("p.tar", plugin_packages(tiny_bundle, "swiglu", [2])[0])})
    assert r.status_code == 200, r.text
    records = _under_load(url, stack, LOAD_S, _decided(stack, "swiglu"), at_least_s=8.0)
    p = stack.store.pointer("swiglu")
    verdicts = [e for e in stack.events if e["kind"] in ("probation_passed", "probation_failed", "rollback")]
    assert (p.version, p.state) == ("2", "confirmed"), verdicts
    assert [e["kind"] for e in verdicts] == ["probation_passed"], verdicts
    answered = sum(r["status"] == 200 for r in records)
    assert answered > 50 and all(r["status"] in (200, 429) for r in records)
    jitter = [e for e in stack.watchdog.events if e.kind == "jitter"]
    print(f"{len(records)} requests ({answered} answered), {len(jitter)} watchdog jitter events, "
          f"verdict: {verdicts[0]['detail']}")


def test_a_20_percent_slower_plugin_is_rolled_back_under_the_same_load_and_not_blocked(watched, tiny_bundle,
                                                                                        monkeypatch):
    url, stack, auth = watched
    _under_load(url, stack, 4.0, lambda: False)  # the load's own step time, measured before the swap
    step_ms = stack.engine.tracker.stats("token", time.monotonic()).p50_ms
    calls = stack.bundle.config.n_layers  # swiglu calls per decode step
    monkeypatch.setattr(stack, "_load", lambda plugin: (_slowed(0.3 * step_ms / 1000 / calls), f"plugin:v{plugin.version}"))
    r = httpx.post(url + "/v1/plugins", headers=auth, timeout=60,
                   files={"file": ("p.tar", plugin_packages(tiny_bundle, "swiglu", [2])[0])})
    assert r.status_code == 200, r.text
    _under_load(url, stack, LOAD_S, _decided(stack, "swiglu"))
    p = stack.store.pointer("swiglu")
    failed = [e for e in stack.events if e["kind"] in ("probation_failed", "rollback")]
    assert p.version is None and "2" not in p.blocked, (p, stack.events[-5:])
    assert failed and "control" in json.dumps(failed), failed  # judged against the control arm
    assert any(e["kind"] == "rollback" and e["blocked"] is False for e in failed)


def test_a_jitter_event_on_a_plugin_on_probation_rolls_it_back(tiny_server, tiny_bundle, monkeypatch):
    """#33 item 2's done-when: the watchdog, a slowed kernel on probation, the rollback in the store and the log."""
    url, stack, auth = tiny_server
    stack.policy.requests = 10_000  # no probation verdict in this test: only the watchdog can act
    log = stack.log.path.parent / "watchdog.jsonl"
    stack.start_watchdog(PolicyConfig(jitter_budget_ms=1.0, min_samples=10, cooldown_s=0.3, window_s=5.0), sensors=[],
                         log_path=log)
    monkeypatch.setattr(stack, "_load", lambda plugin: (_slowed(0.005), f"plugin:v{plugin.version}"))
    r = httpx.post(url + "/v1/plugins", headers=auth, timeout=60,
                   files={"file": ("p.tar", plugin_packages(tiny_bundle, "swiglu", [2])[0])})
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 60
    with httpx.Client(base_url=url, timeout=30) as c:
        while stack.store.pointer("swiglu").version is not None and time.monotonic() < deadline:
            assert c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 20}).status_code == 200
    stack.admin_worker.submit(lambda: None).result(30)
    p = stack.store.pointer("swiglu")
    assert p.version is None and "2" not in p.blocked and "watchdog jitter event" in p.note, p
    stack.log.flush()
    events = [json.loads(x) for x in stack.log.path.read_text().splitlines()]
    assert any(e.get("kind") == "rollback" and "watchdog jitter event" in e.get("reason", "") for e in events)
    stack.watchdog.stop()
    acted = [a for line in log.read_text().splitlines() if (rec := json.loads(line)).get("type") == "event"
             for a in rec.get("actions", []) if a["action"] == "rollback_plugin"]
    assert any(a["status"] == "done" and "rolling back" in a["detail"] for a in acted), acted
