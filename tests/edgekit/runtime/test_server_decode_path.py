"""serve says which decode path its device thread runs, in /v1/models, /healthz and /metrics, and a swap of an
operator moves the report with the path (checked here on the CPU, where the path is the eager per-operator one)."""

from __future__ import annotations

import httpx
from prometheus_client.openmetrics.parser import text_string_to_metric_families as strict_parse

from edgekit.kernels.rmsnorm import rmsnorm_reference


def _metric(url: str) -> list[dict]:
    om = httpx.get(url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}, timeout=30)
    fam = {f.name: f for f in strict_parse(om.text)}["edgekit_decode_path"]
    return [dict(s.labels, value=s.value) for s in fam.samples]


def test_the_active_decode_path_is_reported(tiny_server):
    url, stack, _ = tiny_server
    models = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]
    health = httpx.get(url + "/healthz", timeout=30).json()
    want = stack.engine.decode_path.to_dict()
    assert want["path"] == "per-operator" and "no GPU" in want["reason"]
    assert models["decode_path"] == want and health["decode_path"] == want and models["graphed"] is False
    assert _metric(url) == [{"path": "per-operator", "graphed": "false", "value": 1.0}]


def test_the_report_follows_the_runner_a_swap_installs(tiny_server):
    url, stack, _ = tiny_server
    before = stack.engine.decode_path
    stack.engine.switch_operator("rmsnorm", lambda x, w, eps: rmsnorm_reference(x, w, eps), "plugin:test")
    r = httpx.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2}, timeout=30)  # a step picks it up
    assert r.status_code == 200
    assert stack.engine.decode_path is not before  # a new runner, with its own path record
    assert httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["decode_path"] == stack.engine.decode_path.to_dict()


def test_the_metric_flips_to_per_operator_when_a_subsumed_operator_is_swapped():
    """A bundle's fused plugins (the reference math on the CPU) run the fused path; a swap of an operator they
    subsume moves decode, /metrics and /healthz to per-operator, with the operator named in the reason."""
    from runtime_helpers import live_server

    from edgekit.kernels.dispatch import DispatchTable
    from edgekit.model.loader import load_model
    from edgekit.runtime.engine import Engine
    from edgekit.graph.paths import fused_operators
    from edgekit.runtime.server import create_app
    from edgekit.shapes import StaticShapes

    table = DispatchTable()
    for op in fused_operators():  # filed as a bundle's plugins would be
        table.set(op, table.get(op), source="plugin:v1")
    engine = Engine(load_model("preset:tiny", seed=5).decoder().with_ops(table), None,
                    StaticShapes(buckets=(16,), max_seq_len=32), fused_on_cpu=True)
    try:
        with live_server(create_app(engine)) as url, httpx.Client(base_url=url, timeout=30) as c:
            assert _metric(url) == [{"path": "fused", "graphed": "false", "value": 1.0}]
            assert c.get("/healthz").json()["decode_path"]["operator_sources"]["fused_norm_swiglu"] == "plugin:v1"
            engine.switch_operator("rmsnorm", engine.table.get("rmsnorm"), "plugin:v2")
            assert c.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 2}).status_code == 200
            assert _metric(url) == [{"path": "per-operator", "graphed": "false", "value": 1.0}]
            assert "rmsnorm" in c.get("/healthz").json()["decode_path"]["reason"]
    finally:
        engine.close()


def test_serve_takes_the_decode_path_it_is_asked_for():
    """serve --decode-path goes to the engine (and through select_decode_path): per-operator when asked for, even where
    the fused path could run; a path it does not know is refused with the known ones named."""
    import pytest

    from edgekit.errors import EdgekitError
    from edgekit.kernels.dispatch import DispatchTable
    from edgekit.model.loader import load_model
    from edgekit.runtime.engine import Engine
    from edgekit.graph.paths import fused_operators
    from edgekit.shapes import StaticShapes

    table = DispatchTable()
    for op in fused_operators():
        table.set(op, table.get(op), source="plugin:v1")
    dec = load_model("preset:tiny", seed=5).decoder().with_ops(table)
    shapes = StaticShapes(buckets=(16,), max_seq_len=32)
    engine = Engine(dec, None, shapes, fused_on_cpu=True, decode_path="per-operator")
    try:
        assert engine.decode_path.name == "per-operator" and "asked for" in engine.decode_path.reason
        assert engine.submit([1, 2], 3, stop_ids=()).done.wait(30)
    finally:
        engine.close()
    with pytest.raises(EdgekitError, match="fused, per-operator"):
        Engine(dec, None, shapes, decode_path="giant")


def test_serve_refuses_an_unknown_decode_path_before_loading_anything(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "edgekit", "serve", str(tmp_path / "no-bundle"), "--allow-dev-key",
                        "--decode-path", "giant"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--decode-path" in r.stderr and "fused, per-operator" in r.stderr
    assert "no-bundle" not in r.stderr  # refused before the bundle was looked for


def test_serve_waits_in_the_queue_as_long_as_the_engine_does_by_default():
    """The CLI's default is a literal (the CLI does not import torch to show --help); it must stay the engine's."""
    import inspect

    from edgekit.commands.build_commands import serve
    from edgekit.runtime.engine import DEFAULT_MAX_QUEUE_WAIT_S

    assert inspect.signature(serve).parameters["max_queue_wait_ms"].default.default == DEFAULT_MAX_QUEUE_WAIT_S * 1000
