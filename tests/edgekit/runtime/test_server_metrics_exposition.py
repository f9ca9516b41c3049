"""Attack 9: a strict Prometheus scraper. Before: /metrics defined edgekit_time_to_first_token_seconds twice
(server and watchdog registries) plus overlapping request/token families, so strict parsers rejected it.

Now: one registry (the engine's latency tracker, shared with the watchdog) and each family once."""

from __future__ import annotations

import collections

import httpx
from prometheus_client.openmetrics.parser import text_string_to_metric_families as strict_parse
from prometheus_client.parser import text_string_to_metric_families


def test_metrics_parse_strictly_with_the_watchdog_running(tiny_server):
    url, stack, _ = tiny_server
    wd = stack.start_watchdog(sensors=[])
    with httpx.Client(base_url=url, timeout=30) as c:
        assert c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 4}).status_code == 200
        assert c.post("/v1/completions", json={"prompt": [1], "max_tokens": 10**6}).status_code == 400
        text = c.get("/metrics").text
        om = c.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert wd.tracker is stack.engine.tracker
    types = collections.Counter(line.split()[2] for line in text.splitlines() if line.startswith("# TYPE "))
    assert types and max(types.values()) == 1, [n for n, k in types.items() if k > 1]
    names = [f.name for f in text_string_to_metric_families(text)]
    assert len(names) == len(set(names))
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    families = {f.name: f for f in strict_parse(om.text)}  # raises on a duplicate or malformed family
    for name in ("edgekit_time_to_first_token_seconds", "edgekit_token_latency_seconds", "edgekit_request_latency_seconds",
                 "edgekit_requests", "edgekit_generated_tokens", "edgekit_swap_pause_seconds", "edgekit_requests_waiting"):
        assert name in families, name
    served = [s for s in families["edgekit_requests"].samples if s.name == "edgekit_requests_total"]
    assert {(s.labels["route"], s.labels["status"]) for s in served} >= {("completions", "200"), ("completions", "400")}
    ttft = [s for s in families["edgekit_time_to_first_token_seconds"].samples if s.name.endswith("_count")]
    assert ttft[0].value == 1
