"""The engine's fused decode path under a swap, on the CPU: the path's operators are the torch references filed as
the bundle's plugins would be, so path selection, the hand-over and the fallback run exactly as on a GPU (the GPU
version with real plugins, graphs and pause timings is tests/edgekit/runtime/test_engine_gpu.py's job)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from edgekit.generate import Generator
from edgekit.kernels.dispatch import DispatchTable
from edgekit.model.loader import load_model
from edgekit.runtime.engine import Engine, OverloadedError
from edgekit.graph.paths import fused_operators, fused_step_operators
from edgekit.shapes import StaticShapes

pytestmark = pytest.mark.serial  # it times wall-clock behaviour: scripts/test.sh runs it alone, after the parallel phase

SHAPES = StaticShapes(buckets=(16, 32), max_seq_len=64)
REQUESTS, CLIENTS, DEADLINE_S = 24, 3, 120  # bounded in count and in time


@pytest.fixture(scope="module")
def model():
    return load_model("preset:tiny", seed=5)


def _phase(args) -> str:
    """A per-operator call's phase, from its activations: a decode step's rows are (B, N) (or (B, 1, N) around
    RoPE), a prefill's (B, T, N)."""
    x = args[0]
    return "decode" if x.dim() == 2 or (x.dim() == 3 and x.shape[1] == 1) else "prefill"


def _counting_table(calls: Counter) -> DispatchTable:
    """Every operator the reference, counted per call (and per phase); the fused path's own operators filed as
    shipped plugins."""
    table = DispatchTable()
    for op in list(table.sources()) + fused_operators():
        fn = table.get(op)
        table.set(op, lambda *a, _op=op, _fn=fn: (calls.update([_op, f"{_op}@{_phase(a)}"]), _fn(*a))[1],
                  source="plugin:v1" if op in fused_operators() else "reference")
    return table


def test_swap_under_load_falls_back_visibly_and_fails_no_request(model):
    calls: Counter = Counter()
    engine = Engine(model.decoder().with_ops(_counting_table(calls)), None, SHAPES, max_waiting=8, fused_on_cpu=True)
    try:
        before = engine.decode_path.to_dict()
        own = fused_step_operators(model.config, engine.decoder.schemes)  # the Llama family's fused operators
        assert before["path"] == "fused" and before["operator_sources"] == {op: "plugin:v1" for op in own}
        prompts = [[3 + i, 4, 5 + i % 7] for i in range(REQUESTS)]
        want = {tuple(p): Generator(model.decoder(), SHAPES).generate(p, 6)[0] for p in prompts}  # per-operator reference
        results, errors, lock = [], [], threading.Lock()
        todo = list(prompts)
        end = time.monotonic() + DEADLINE_S

        def client():
            while time.monotonic() < end:
                with lock:
                    if not todo:
                        return
                    p = todo.pop()
                try:
                    out = engine.complete(p, 6)
                    with lock:
                        results.append((p, out.token_ids))
                except OverloadedError:
                    with lock:
                        todo.append(p)  # a 429 is an answer, not a failure: retry
                    time.sleep(0.01)
                except Exception as e:  # noqa: BLE001 - any other outcome is a failed request
                    with lock:
                        errors.append(f"{type(e).__name__}: {e}")

        threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        while len(results) < REQUESTS // 3 and time.monotonic() < end:
            time.sleep(0.01)
        fused_calls = calls["fused_norm_qkv_rope"]
        assert fused_calls > 0 and calls["swiglu@decode"] == 0  # decode ran the fused operators, not the per-operator ones
        swiglu = engine.table.get("swiglu")
        engine.switch_operator("swiglu", swiglu, "plugin:v2")  # a subsumed operator is replaced over the air
        for t in threads:
            t.join(DEADLINE_S)
        assert errors == [] and len(results) == REQUESTS  # 0 failed requests
        after = engine.decode_path.to_dict()
        assert after["path"] == "per-operator" and "swiglu" in after["reason"] and "plugin:v2" in after["reason"]
        assert calls["swiglu@decode"] > 0  # decode now runs the per-operator path with the new swiglu
        for p, got in results:  # both paths are the same arithmetic: every answer is the reference's
            assert got == want[tuple(p)], p
    finally:
        engine.close()


def test_swapping_a_fused_operator_itself_keeps_the_fused_path_with_the_new_plugin(model):
    calls: Counter = Counter()
    engine = Engine(model.decoder().with_ops(_counting_table(calls)), None, SHAPES, max_waiting=4, fused_on_cpu=True)
    try:
        op = "fused_proj_residual"
        engine.switch_operator(op, engine.table.get(op), "plugin:v2")
        path = engine.decode_path.to_dict()
        assert path["path"] == "fused" and path["operator_sources"][op] == "plugin:v2"
        assert engine.complete([3, 4, 5], 4).token_ids == Generator(model.decoder(), SHAPES).generate([3, 4, 5], 4)[0]
    finally:
        engine.close()


def test_without_fused_plugins_on_a_cpu_the_engine_decodes_per_operator(model):
    engine = Engine(model.decoder(), None, SHAPES, max_waiting=4)
    try:
        assert engine.decode_path.name == "per-operator" and "CUDA" in engine.decode_path.reason
    finally:
        engine.close()
