"""#29: the device serves what the plan was made for. `serve` used to choose batch buckets 1/2/4 itself (a bundle
planned, tiled and memory-checked for 1 sequence was decoded 4 at a time), and the watchdog read its budgets from
whatever target YAML the device had installed under the bundle's target name."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from edgekit.errors import BundleError


def _open(root):
    from edgekit.runtime.bundle_runtime import open_bundle

    return open_bundle(root, [], allow_dev_key=True, device="cpu", golden=False)


def test_serving_decodes_the_batch_buckets_the_bundle_was_planned_for(tiny_bundle):
    from edgekit.runtime.serving import ServingStack

    b = _open(tiny_bundle)
    planned = tuple(b.manifest.plan["shapes"]["batch_buckets"])
    assert planned == (1, 2, 4) and b.shapes.batch == 4
    stack = ServingStack(b)
    try:
        assert stack.engine.batch_buckets == planned
    finally:
        stack.close()
    assert b.serving_buckets(None) == planned and b.serving_buckets(3) == (1, 2, 3) and b.serving_buckets(1) == (1,)


def test_serving_more_sequences_than_the_plan_is_refused_naming_both_numbers(tiny_bundle):
    with pytest.raises(BundleError, match=r"batch 8 is more than .* planned for \(4\)") as e:
        _open(tiny_bundle).serving_buckets(8)
    assert "edgekit build --batch 8" in e.value.hint


def test_serve_with_a_batch_beyond_the_plan_exits_2_before_the_store_is_made(tiny_bundle, tmp_path):
    store = tmp_path / "store"
    r = subprocess.run([sys.executable, "-m", "edgekit", "serve", str(tiny_bundle), "--allow-dev-key", "--store",
                        str(store), "--port", "0", "--no-watchdog", "--batch", "8"], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 2 and "planned for (4)" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert not (store / "ops").exists()


@pytest.fixture(scope="module")
def field_bundle(tmp_path_factory):
    """A bundle planned for 2 sequences on a board profile the serving device does not have installed."""
    from edgekit.builder import BuildOptions, build_bundle
    from edgekit.plan.targets import builtin_targets_dir

    d = tmp_path_factory.mktemp("field")
    profile = yaml.safe_load((builtin_targets_dir() / "orin.yaml").read_text())
    profile.update(name="field-board", watchdog={"jitter_budget_ms": 7.5, "power_band_w": 1.25,
                                                 "temperature_warn_c": 70, "temperature_limit_c": 90})
    target_file = d / "field-board.yaml"
    target_file.write_text(yaml.safe_dump(profile))
    out = build_bundle(BuildOptions(model="preset:tiny", target=str(target_file), out=d / "bundle", dev_key=True,
                                    precision="fp16", context=64, buckets=(16,), batch=2, onnx=False,
                                    cache_dir=d / "cache")).out
    target_file.unlink()
    return out


def test_a_bundle_planned_for_two_sequences_is_served_two_at_a_time(field_bundle):
    from edgekit.runtime.serving import ServingStack

    stack = ServingStack(_open(field_bundle))
    try:
        assert stack.engine.batch_buckets == (1, 2)  # the engine's own default would be (1, 2, 4)
    finally:
        stack.close()


def test_the_watchdog_holds_a_bundle_to_its_plans_budgets_not_to_the_installed_profile(field_bundle):
    from edgekit.runtime.serving import ServingStack

    stack = ServingStack(_open(field_bundle))
    try:
        wd = stack.start_watchdog(sensors=[])
        assert (wd.policy.jitter_budget_ms, wd.policy.power_band_w) == (7.5, 1.25)
        assert (wd.policy.temperature.warn_c, wd.policy.temperature.critical_c) == (70, 90)
    finally:
        stack.close()


def test_the_watchdogs_latency_records_and_report_say_what_measured_them(field_bundle, tmp_path):
    """A CPU serve's latencies were logged and reported with no label, beside budgets made for the target."""
    import json
    import time

    from edgekit.power.report import summarise, read_log, summary_rows
    from edgekit.runtime.serving import ServingStack

    stack = ServingStack(_open(field_bundle))
    log = tmp_path / "watchdog.jsonl"
    try:
        wd = stack.start_watchdog(sensors=[], log_path=log)
        stack.engine.complete([1, 2, 3], 6)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and '"latency"' not in (log.read_text() if log.exists() else ""):
            wd.logger.flush()
            time.sleep(0.1)
    finally:
        stack.close()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    latency = [r for r in records if r["type"] == "latency"]
    assert latency and {r["measured_on"] for r in latency} == {"cpu"}  # edgekit.measured_on's word, as run and generate
    summary = summarise(read_log(log))
    assert summary["latency_measured_on"] == "cpu"
    # the report says it in words, and that a CPU's latencies are not the target device's
    assert ("latency", "measured on the CPU (edgekit's reference operators; not the target device)") in summary_rows(summary)
