"""The process-wide admin GPU lock (edgekit.runtime.gpu_admin_lock): a golden check and an operator switch (its
graph captures) never overlap, and serving never waits on either.

The attack it answers, seen on the H200: a rollback re-capturing graphs on serving's admin worker while the HTTP
admin pool ran the next install's golden check; the check failed with "operation not permitted when stream is
capturing" and a healthy plugin was refused as a golden mismatch. On the CPU there is no capture, but the
serialization is the same code: these tests hold one side inside its critical section and watch the other wait.
"""

from __future__ import annotations

import threading

import pytest

import realpkg
from edgekit.bundle.golden import run_reference
from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.model.loader import load_model
from edgekit.runtime.engine import Engine
from edgekit.runtime.gpu_admin_lock import gpu_admin_work, held_here
from edgekit.runtime.plugin_checks import golden_checker, package_verifier
from edgekit.shapes import StaticShapes

AUTHOR = realpkg.key(1)
SHAPES = StaticShapes(buckets=(16, 32), max_seq_len=64)
WAIT_S = 0.3  # how long a blocked side is watched not finishing (a pass never depends on it being long enough)


@pytest.fixture(scope="module")
def plugin():
    return package_verifier(realpkg.trusted(AUTHOR))(realpkg.pack(AUTHOR, 2))


@pytest.fixture()
def engine():
    e = Engine(load_model("preset:tiny", seed=5).decoder(), None, SHAPES, max_waiting=4)
    yield e
    e.close()


def _in_thread(fn) -> threading.Event:
    done = threading.Event()
    errors: list[BaseException] = []

    def body():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - re-raised by the test through done.errors
            errors.append(e)
        done.set()

    done.errors = errors  # type: ignore[attr-defined]
    threading.Thread(target=body, daemon=True).start()
    return done


def _holding_lock():
    """A thread inside gpu_admin_work (as a capture would be) until the returned release is set."""
    inside, release = threading.Event(), threading.Event()

    def hold():
        with gpu_admin_work():
            inside.set()
            release.wait(30)

    threading.Thread(target=hold, daemon=True).start()
    assert inside.wait(10)
    return release


def test_a_golden_check_loads_runs_and_unloads_its_kernels_under_the_lock(plugin):
    seen = []

    def runner_for(p):
        seen.append(("load", held_here()))

        def run(op, inputs, attributes, label):
            seen.append(("run", held_here()))
            return run_reference(op, inputs, attributes, label)

        run.unload = lambda: seen.append(("unload", held_here()))
        return run

    golden_checker(runner_for)(plugin)
    assert seen and {step for step, _ in seen} == {"load", "run", "unload"}
    assert all(held for _, held in seen), seen
    assert not held_here()  # released afterwards


def test_a_golden_check_waits_while_a_capture_holds_the_lock(plugin):
    release = _holding_lock()
    try:
        done = _in_thread(lambda: golden_checker()(plugin))
        assert not done.wait(WAIT_S), "the golden check ran while another thread was capturing"
    finally:
        release.set()
    assert done.wait(30) and not done.errors, done.errors


def test_an_operator_switch_waits_for_a_golden_check_in_progress(engine, plugin):
    inside, release = threading.Event(), threading.Event()

    def slow_runner(p):
        def run(op, inputs, attributes, label):
            inside.set()
            release.wait(30)
            return run_reference(op, inputs, attributes, label)

        return run

    check = _in_thread(lambda: golden_checker(slow_runner)(plugin))
    try:
        assert inside.wait(10)
        switch = _in_thread(lambda: engine.switch_operator("rmsnorm", rmsnorm_reference, "plugin:2"))
        assert not switch.wait(WAIT_S), "the switch prepared its runner while a golden check was running"
        assert engine.table.sources()["rmsnorm"] != "plugin:2"
    finally:
        release.set()
    assert check.wait(30) and not check.errors, check.errors
    assert switch.wait(30) and not switch.errors, switch.errors
    assert engine.table.sources()["rmsnorm"] == "plugin:2"


def test_serving_never_waits_on_the_lock(engine):
    release = _holding_lock()
    try:
        job = engine.submit([3, 4, 5], 8, stop_ids=())
        assert job.done.wait(60) and job.error is None, job.error
        assert len(job.tokens) == 8
    finally:
        release.set()


def test_the_lock_is_reentrant_on_one_thread_and_exclusive_across_threads():
    with gpu_admin_work():
        with gpu_admin_work():  # an operator switch holds it across the plugin load and the capture
            assert held_here()
        assert held_here()
        other = []
        t = threading.Thread(target=lambda: other.append(held_here()))
        t.start()
        t.join()
        assert other == [False]
    assert not held_here()


def test_a_pinned_stream_is_the_side_stream_and_the_capture_stream_of_this_thread_only():
    # why: torch's own side streams come from its pool, made in the primary context, so a warm-up or capture there
    # would escape a green context (edgekit.bench.sm_partition); pinned, they use the partition's stream
    import edgekit.runtime.gpu_admin_lock as lock

    pinned, other = object(), []
    with lock.pinned_stream(pinned):
        assert lock.side_stream() is pinned
        t = threading.Thread(target=lambda: other.append(getattr(lock._pinned, "stream", None)))
        t.start()
        t.join()
        with lock.pinned_stream(None):  # nested: None unpins
            assert getattr(lock._pinned, "stream", None) is None
        assert lock.side_stream() is pinned
    assert getattr(lock._pinned, "stream", None) is None and other == [None]
