"""Policy budgets (profile + overrides), the rules that raise events, and the actions they run."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit.errors import ConfigError
from edgekit.power.actions import ActionRegistry, NvpmodelAction
from edgekit.power.events import Event
from edgekit.power.latency import window_stats
from edgekit.power.policy import PolicyConfig, PolicyEngine
from edgekit.power.sample import PowerSample
from edgekit.power.sensors.tegrastats import replay_log

LOGS = Path(__file__).parent / "fixtures" / "tegrastats"


def test_defaults_match_the_product_card():
    c = PolicyConfig()
    assert (c.jitter_budget_ms, c.power_band_w) == (5.0, 3.0)


def test_profile_budgets_then_deployment_overrides():
    profile = {"name": "orin-nano-8gb", "sm": 87, "budgets": {"jitter_budget_ms": 4, "power_band_w": 2.5},
               "watchdog": {"temp_warn_c": 80}, "power_modes": [{"name": "15W"}]}
    c = PolicyConfig.from_profile(profile, {"power_target_w": 15, "temperature": {"critical_c": 90}})
    assert c.jitter_budget_ms == 4 and c.power_band_w == 2.5 and c.power_target_w == 15
    assert (c.temperature.warn_c, c.temperature.critical_c) == (80, 90)


def test_bad_override_names_the_field_and_the_value():
    with pytest.raises(ConfigError, match=r"jitter_budget_ms.*got -1"):
        PolicyConfig.from_profile(None, {"jitter_budget_ms": -1})
    with pytest.raises(ConfigError, match="jitter_budget_mss"):
        PolicyConfig.from_profile(None, {"jitter_budget_mss": 3})
    with pytest.raises(ConfigError, match="critical_c"):
        PolicyConfig.from_profile(None, {"temperature": {"warn_c": 90, "critical_c": 80}})



@pytest.mark.parametrize("override", [{"power_band_w": float("inf")}, {"jitter_budget_ms": float("inf")},
                                      {"window_s": float("nan")}, {"temperature": {"critical_c": float("inf")}}])
def test_an_infinite_or_nan_budget_is_refused_not_a_check_turned_off(override):
    """`monitor --power-band-w inf` passed `gt=0` and turned the power band off without a word (its log said null)."""
    with pytest.raises(ConfigError, match=r"finite number.*got (inf|nan)"):
        PolicyConfig.from_profile(None, override)

def _steady(n=50, base=8.0):
    return window_stats("token", [base + 0.1 * (i % 5) for i in range(n)], 10.0)


def test_spike_rule_fires_above_p50_plus_budget_only():
    eng = PolicyEngine(PolicyConfig(cooldown_s=0))
    before = _steady()
    assert eng.check_spikes("token", [(1.0, before.p50_ms + 4.9)], before, 0.0) == []
    (e,) = eng.check_spikes("token", [(1.0, 8.1), (1.1, before.p50_ms + 5.5)], before, 0.0)
    assert e.kind == "jitter" and e.evidence["rule"] == "spike"
    assert e.evidence["budget_ms"] == 5.0 and e.evidence["value_ms"] == pytest.approx(before.p50_ms + 5.5)


def test_spike_rule_needs_enough_samples_and_respects_cooldown():
    eng = PolicyEngine(PolicyConfig(cooldown_s=5))
    assert eng.check_spikes("token", [(0.0, 100.0)], _steady(n=5), 0.0) == []
    assert len(eng.check_spikes("token", [(0.0, 100.0)], _steady(), 10.0)) == 1
    assert eng.check_spikes("token", [(0.0, 100.0)], _steady(), 12.0) == []  # within 5 s
    assert len(eng.check_spikes("token", [(0.0, 100.0)], _steady(), 15.5)) == 1
    assert eng.check_spikes("ttft", [(0.0, 900.0)], _steady(), 30.0) == []  # ttft is not held to the budget by default


def test_window_rule_on_p99_minus_p50():
    eng = PolicyEngine(PolicyConfig())
    assert eng.check_window(_steady(), 0.0) == []
    wide = window_stats("token", [8.0] * 90 + [20.0] * 10, 10.0)  # p99 - p50 = 12 ms
    (e,) = eng.check_window(wide, 0.0)
    assert e.evidence["rule"] == "p99-p50" and e.evidence["jitter_ms"] == pytest.approx(12.0)


def test_power_band_on_a_replayed_load_step_with_a_target():
    eng = PolicyEngine(PolicyConfig(power_target_w=6.0, power_band_w=3.0, power_sustain_s=1.0))
    samples = replay_log(LOGS / "orin-nano-8gb-load-step.log").samples
    events = [(i, e) for i, s in enumerate(samples) for e in eng.check_power(s)]
    # the load starts at line 11 (index 10, 12.1 W > 9 W); sustained for 1 s at index 11
    assert [i for i, _ in events] == [11]
    e = events[0][1]
    assert e.evidence["centre_w"] == 6.0 and e.evidence["centre_source"] == "target"
    assert e.evidence["total_w"] == pytest.approx(12.124) and e.evidence["total_source"] == "VDD_IN"


def test_power_band_learns_its_centre_when_no_target():
    eng = PolicyEngine(PolicyConfig(power_baseline_s=5.0, power_sustain_s=1.0))
    samples = replay_log(LOGS / "orin-nano-8gb-load-step.log").samples
    events = [e for s in samples for e in eng.check_power(s)]
    # median of the first 5 s (t = 0..4 s): 5710, 5733, 5756, 5779, 5710 mW
    assert eng.power_centre_w == pytest.approx(5.733)
    assert len(events) == 1 and events[0].evidence["centre_source"] == "baseline_median"


def test_one_noisy_sample_is_not_a_breach():
    eng = PolicyEngine(PolicyConfig(power_target_w=6.0, power_sustain_s=1.0))
    mk = lambda t, w: PowerSample(t_s=t, source="x", total_mw=w * 1000)
    assert eng.check_power(mk(0, 6)) + eng.check_power(mk(1, 12)) + eng.check_power(mk(2, 6)) + eng.check_power(mk(3, 12)) == []


def test_temperature_warning_and_critical():
    eng = PolicyEngine(PolicyConfig(temperature={"warn_c": 80, "critical_c": 90}))
    evs = eng.check_temperatures(PowerSample(t_s=0, source="x", temps_c={"cpu": 70, "gpu": 85, "tj": 95}))
    assert sorted((e.evidence["zone"], e.severity) for e in evs) == [("gpu", "warning"), ("tj", "critical")]


def test_sensor_that_disappears_raises_one_event():
    eng = PolicyEngine()
    ok = PowerSample(t_s=0, source="ina3221", total_mw=1.0)
    gone = PowerSample.unavailable("ina3221", "no rail could be read", 1.0)
    assert eng.check_sensor(ok) == []
    assert [e.kind for e in eng.check_sensor(gone)] == ["sensor"]
    assert eng.check_sensor(gone) == []


def _event():
    return Event(t_s=0.0, kind="jitter", severity="warning", message="m")


def test_actions_run_registered_callbacks_and_report_missing_ones():
    reg = ActionRegistry()
    called = []
    reg.register("rollback_plugin", lambda e: called.append(e.kind) or "rolled back attention_decode v2 -> v1")
    res = reg.run(_event(), ["rollback_plugin", "shed_load"])
    assert called == ["jitter"]
    assert [(r.action, r.status) for r in res] == [("rollback_plugin", "done"), ("shed_load", "not_registered")]
    assert "v2 -> v1" in res[0].detail and "would shed load" in res[1].detail


def test_a_failing_callback_is_recorded_not_raised():
    reg = ActionRegistry()
    reg.register("shed_load", lambda e: 1 / 0)
    (r,) = reg.run(_event(), ["shed_load"])
    assert r.status == "failed" and "ZeroDivisionError" in r.detail


def test_dry_run_runs_nothing():
    reg = ActionRegistry()
    reg.register("shed_load", lambda e: pytest.fail("must not run"))
    (r,) = reg.run(_event(), ["shed_load"], dry_run=True)
    assert r.status == "dry_run"


def test_nvpmodel_without_the_tool_reports_what_it_would_run(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty PATH: no nvpmodel here
    assert NvpmodelAction(2)(_event()) == "nvpmodel not found on this machine: would have run `nvpmodel -m 2`"


def test_nvpmodel_runs_the_tool_where_it_exists(monkeypatch, tmp_path):
    # a stand-in nvpmodel on PATH that records its arguments (the real one needs a Jetson and root)
    tool = tmp_path / "nvpmodel"
    tool.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert NvpmodelAction(1)(_event()) == "ran `nvpmodel -m 1`"
    assert (tmp_path / "args").read_text().strip() == "-m 1"
    tool.write_text("#!/bin/sh\necho 'NVPM ERROR: need root' >&2\nexit 1\n")
    reg = ActionRegistry()
    reg.register("power_mode", NvpmodelAction(1))
    (r,) = reg.run(_event(), ["power_mode"])
    assert r.status == "failed" and "need root" in r.detail
