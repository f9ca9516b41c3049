"""The server says which decode path runs: /metrics (edgekit_decode_path{path}) and /healthz, and follows a swap."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def _paths(text: str) -> dict[str, float]:
    fam = next(f for f in text_string_to_metric_families(text) if f.name == "edgekit_decode_path")
    return {s.labels["path"]: s.value for s in fam.samples}


def test_metrics_and_healthz_report_the_decode_path(tiny_server):
    url, stack, _ = tiny_server
    with httpx.Client(base_url=url, timeout=30) as c:
        health = c.get("/healthz").json()
        metrics = _paths(c.get("/metrics").text)
    # this stack runs on the CPU (no fused plugins can run there): per operator, and it says why
    assert health["decode_path"]["path"] == "per-operator" and "CUDA" in health["decode_path"]["reason"]
    assert metrics == {"fused": 0.0, "per-operator": 1.0}


def test_the_metric_flips_to_per_operator_when_a_subsumed_operator_is_swapped():
    from conftest import live_server

    from edgekit.kernels.dispatch import DispatchTable
    from edgekit.model.loader import load_model
    from edgekit.runtime.engine import Engine
    from edgekit.runtime.fused_decode import STEP
    from edgekit.runtime.server import create_app
    from edgekit.shapes import StaticShapes

    table = DispatchTable()
    for op in STEP.own_operators():  # filed as a bundle's plugins would be (the reference math on the CPU)
        table.set(op, table.get(op), source="plugin:v1")
    engine = Engine(load_model("preset:tiny", seed=5).decoder().with_ops(table), None,
                    StaticShapes(buckets=(16,), max_seq_len=32), fused_on_cpu=True)
    try:
        with live_server(create_app(engine)) as url, httpx.Client(base_url=url, timeout=30) as c:
            assert _paths(c.get("/metrics").text) == {"fused": 1.0, "per-operator": 0.0}
            assert c.get("/healthz").json()["decode_path"]["operator_sources"]["fused_norm_swiglu"] == "plugin:v1"
            engine.switch_operator("rmsnorm", engine.table.get("rmsnorm"), "plugin:v2")
            assert _paths(c.get("/metrics").text) == {"fused": 0.0, "per-operator": 1.0}
            assert "rmsnorm" in c.get("/healthz").json()["decode_path"]["reason"]
    finally:
        engine.close()
