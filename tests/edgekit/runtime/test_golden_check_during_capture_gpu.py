"""On a GPU: golden checks on one admin thread while another captures graphs in a loop, under streaming load.

The H200 defect (serve bench, persistent phase): a rollback's re-capture on serving's admin worker overlapped the
next install's golden check on the HTTP admin pool; the check failed with "operation not permitted when stream
is capturing" and a healthy plugin was refused as a golden mismatch. Here the same three parties run at once on a
tiny bundle served on the persistent decode path: the device thread decoding requests, a thread switching
fused_norm_swiglu back and forth (each switch warms up and captures the decode graphs; the path alternates
persistent <-> fused, so both kinds of capture happen), and this thread running a real compiled plugin's golden
check again and again. Every check must pass, every switch must land, no request may fail; a wrong plugin is
still refused on its numbers.
"""

from __future__ import annotations

import threading
import time

import pytest

import realpkg
from edgekit.runtime.engine import Engine
from edgekit.runtime.plugin_checks import golden_checker, gpu_runner, package_verifier
from edgekit.runtime.plugin_policy import SwapRefused

pytestmark = pytest.mark.gpu
AUTHOR = realpkg.key(1)
PROMPTS = [[3, 4, 5], [7, 8, 9, 10, 11], [1], list(range(20, 38))]
SWITCHES = 8  # captures on the other thread; checks run for as long as they do
OP = "fused_norm_swiglu"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from gpu_bundles import tiny_h200_bundle

    return tiny_h200_bundle(tmp_path_factory.mktemp("capture-race"))


def _load(engine: Engine, stop: threading.Event, errors: list, served: list) -> None:
    while not stop.is_set():
        jobs = [engine.submit(p, 24, stop_ids=()) for p in PROMPTS]
        for j in jobs:
            if not j.done.wait(120) or j.error is not None:
                errors.append(j.error or "timed out")
            else:
                served.append(len(j.tokens))


def test_golden_checks_while_another_thread_captures_graphs_all_succeed(bundle):
    _, good, wrong = realpkg.compiled_rmsnorm_packages(AUTHOR)
    verify = package_verifier(realpkg.trusted(AUTHOR))
    good_plugin, wrong_plugin = verify(good), verify(wrong)
    check = golden_checker(gpu_runner())
    check(good_plugin)  # loads and JITs once before the race

    e = Engine(bundle.decoder(), None, bundle.shapes, cuda_graphs=True, decode_path="persistent")
    try:
        assert e.decode_path.name == "persistent", e.decode_path.reason
        impl, baseline = e.table.get(OP), e.table.sources()[OP]
        paths, switch_errors = [], []

        def switch_loop():
            try:
                for i in range(SWITCHES):  # odd: a new version (fused path); even: the bundle's own (persistent)
                    e.switch_operator(OP, impl, f"plugin:v{100 + i}" if i % 2 == 0 else baseline)
                    paths.append(e.decode_path.name)
                    # let the device thread take the new runner (a step, ~1 ms) before the next warm-up: a persistent
                    # warm-up beside a persistent replay is two grid-barrier kernels at once (not this test's subject)
                    time.sleep(0.05)
            except BaseException as err:  # noqa: BLE001 - reported by the assertion below
                switch_errors.append(err)

        stop, load_errors, served = threading.Event(), [], []
        load = threading.Thread(target=_load, args=(e, stop, load_errors, served), daemon=True)
        load.start()
        switcher = threading.Thread(target=switch_loop, daemon=True)
        t0 = time.perf_counter()
        switcher.start()
        checks, deadline = 0, time.monotonic() + 300
        while switcher.is_alive() and time.monotonic() < deadline:
            check(good_plugin)  # raises SwapRefused(golden_mismatch) if it raced a capture
            checks += 1
            time.sleep(0.02)  # the lock is not fair: leave the switcher a moment to take it between two checks
        switcher.join(60)
        assert not switcher.is_alive(), f"the switches did not finish ({len(paths)} of {SWITCHES})"
        seconds = time.perf_counter() - t0
        stop.set()
        load.join(240)

        assert not switch_errors, switch_errors
        assert paths == ["fused", "persistent"] * (SWITCHES // 2), paths
        captured = [p for p in e.swap_prepares if p["captured"]]
        assert len(captured) == SWITCHES, e.swap_prepares
        assert checks >= 2, f"only {checks} golden checks ran while the graphs were captured"
        assert not load_errors and served, load_errors
        with pytest.raises(SwapRefused) as refused:
            check(wrong_plugin)
        assert refused.value.reason == "golden_mismatch" and "running rmsnorm failed" not in str(refused.value), str(refused.value)
        pauses = sorted(e.swap_pauses_s)
        print(f"measured on the GPU: {checks} golden checks beside {SWITCHES} switches (captures) in {seconds:.1f} s, "
              f"{len(served)} requests served, switch pause max {pauses[-1] * 1e3:.3f} ms")
    finally:
        e.close()
