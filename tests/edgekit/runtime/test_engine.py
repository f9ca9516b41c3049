"""Engine semantics: a swap never changes the operators of a request in flight; capacity is bounded."""

from __future__ import annotations

import threading

import pytest

from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.model.loader import load_model
from edgekit.runtime.engine import Engine, OverloadedError
from edgekit.shapes import StaticShapes


@pytest.fixture()
def engine():
    m = load_model("preset:tiny", seed=5)
    return Engine(m.decoder(), None, StaticShapes(buckets=(16,), max_seq_len=48), max_waiting=0)


def test_request_in_flight_keeps_its_operators_and_the_next_one_uses_the_new(engine):
    calls = {"old": 0, "new": 0}
    inside, release = threading.Event(), threading.Event()

    def old(x, w, eps):
        calls["old"] += 1
        inside.set()
        release.wait(5)
        return rmsnorm_reference(x, w, eps)

    def new(x, w, eps):
        calls["new"] += 1
        return rmsnorm_reference(x, w, eps)

    engine.switch_operator("rmsnorm", old, "plugin:1")
    baseline = calls["old"]
    results = {}
    t = threading.Thread(target=lambda: results.setdefault("a", engine.complete([3, 4, 5], 4)))
    t.start()
    assert inside.wait(5)
    pause = engine.switch_operator("rmsnorm", new, "plugin:2")  # while request A is inside the old kernel
    release.set()
    t.join(10)
    assert calls["new"] == 0 and calls["old"] > baseline  # A finished entirely on the old kernel
    b = engine.complete([3, 4, 5], 4)
    assert calls["new"] > 0
    assert results["a"].token_ids == b.token_ids  # both kernels compute the same thing
    assert pause < 0.05 and engine.table.sources()["rmsnorm"] == "plugin:2"


def test_switch_back_to_reference(engine):
    engine.switch_operator("rmsnorm", lambda x, w, eps: rmsnorm_reference(x, w, eps), "plugin:1")
    engine.switch_operator("rmsnorm", None, "reference")
    assert engine.table.sources()["rmsnorm"] == "reference"


def test_no_free_slot_is_overloaded(engine):
    assert engine._slots.acquire(blocking=False)  # the only slot (max_waiting=0)
    try:
        with pytest.raises(OverloadedError):
            engine.complete([1, 2], 2)
    finally:
        engine._slots.release()
