"""Policy budgets (profile + overrides), the rules that raise events, and the actions they run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edgekit.errors import ConfigError
from edgekit.power.actions import ActionRegistry, NvpmodelAction
from edgekit.power.events import Event
from edgekit.power.latency import window_stats
from edgekit.power.policy import PolicyConfig, PolicyEngine
from edgekit.power.sample import PowerSample
from edgekit.power.sensors.tegrastats import parse_line, replay_log

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

@pytest.mark.parametrize("override, said", [
    ({"jitter_metrics": ["tokens"]}, "unknown latency metric 'tokens'; choose from ttft, token, request"),
    ({"actions": {"jiter": ["rollback_plugin"]}}, "unknown event kind 'jiter'; choose from jitter, power_band"),
])
def test_a_metric_or_event_kind_that_names_nothing_is_refused_not_a_rule_turned_off(override, said):
    """jitter_metrics [tokens] was taken and no latency metric was ever held to the jitter budget; actions keyed by a
    misspelt event kind never ran. Both without a word."""
    with pytest.raises(ConfigError, match=re.escape(said)):
        PolicyConfig.from_profile(None, override)
    assert PolicyConfig.from_profile(None, {"jitter_metrics": ["token", "ttft"], "actions": {"throttle": ["power_mode"]}})


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


_AGX = ("11-21-2025 08:50:{:02d} RAM 14001/62780MB CPU [50%@2201,off] GR3D_FREQ 40%@[1300,1300] GPU@70C "
        "VDD_GPU_SOC 9000mW/8000mW VDD_CPU_CV 12000mW/11000mW VIN_SYS_5V0 5000mW/5000mW VDDQ_VDD2_1V8AO 1200mW/1100mW")


def _agx(second: int, cut: bool = False) -> PowerSample:
    """An AGX Orin line (no input rail: the power is the sum of its four rails, 27.2 W), or the same line cut off
    in its third rail as a killed tegrastats leaves its last one ('VIN_SYS_5V0 50'): a sum of two rails, 21 W."""
    line = _AGX.format(second)
    return parse_line(line[:line.index("VIN_SYS_5V0") + 14] if cut else line)


def test_a_reading_missing_a_rail_is_not_held_against_the_band_of_the_full_sum():
    """A sum of fewer rails (a tegrastats line cut short, an INA3221 channel that failed a read) was compared with the
    band learnt on the full sum: 21 W against 27.2 ± 3 W raised 'sum of VDD_GPU_SOC + VDD_CPU_CV 21.00 W is below
    the band', an event (shed_load in the runtime) for a reading, not for the board."""
    eng = PolicyEngine(PolicyConfig(power_baseline_s=5.0, power_sustain_s=1.0))
    cut = [_agx(10, cut=True), _agx(11, cut=True), _agx(12, cut=True)]
    assert cut[0].rails_sum_mw == 21000.0 and cut[0].rails_sum_of == ["VDD_GPU_SOC", "VDD_CPU_CV"]
    assert [e for s in [_agx(i) for i in range(10)] + cut for e in eng.check_power(s)] == []
    assert eng.power_centre_w == pytest.approx(27.2)
    assert _four_rails_drop_to_20_w(eng, from_second=13) == [20.0]  # the full sum is still watched


def _four_rails_drop_to_20_w(eng: PolicyEngine, from_second: int) -> list[float]:
    """The watts of the events a real drop of the whole sum (all four rails, 20 W for 3 s) raises."""
    drop = [PowerSample(t_s=_agx(i).t_s, source="tegrastats", rails_sum_mw=20000.0, rails_sum_of=_agx(0).rails_sum_of)
            for i in range(from_second, from_second + 3)]
    return [e.evidence["total_w"] for s in drop for e in eng.check_power(s)]


def test_a_cut_first_line_gives_way_to_the_full_sum_and_the_band_still_watches_it():
    eng = PolicyEngine(PolicyConfig(power_baseline_s=5.0, power_sustain_s=1.0))
    samples = [_agx(0, cut=True), *(_agx(i) for i in range(1, 12))]
    assert [e for s in samples for e in eng.check_power(s)] == []
    assert eng.power_centre_w == pytest.approx(27.2)
    assert _four_rails_drop_to_20_w(eng, from_second=12) == [20.0]


def test_a_rail_lost_for_good_is_said_once_not_a_band_switched_off_without_a_word():
    """Readings lacking a rail are not compared with the band; a run of them (a rail gone for good) raises one sensor
    warning naming what is missing, and a full reading puts the band back to work."""
    from edgekit.power.policy import READINGS_BEFORE_SENSOR_WARNING

    eng = PolicyEngine(PolicyConfig(power_baseline_s=5.0, power_sustain_s=1.0))
    assert [e for s in [_agx(i) for i in range(10)] for e in eng.check_power(s)] == []
    n = READINGS_BEFORE_SENSOR_WARNING
    events = [e for i in range(10, 10 + 3 * n) for e in eng.check_power(_agx(i, cut=True))]
    assert [e.kind for e in events] == ["sensor"], events  # once, not every reading
    lacking = sorted(set(_agx(0).rails_sum_of) - {"VDD_GPU_SOC", "VDD_CPU_CV"})
    assert events[0].evidence["lacking"] == ", ".join(lacking) and events[0].evidence["readings"] == n
    assert f"the last {n} power readings of tegrastats lack {', '.join(lacking)}" in events[0].message
    assert _four_rails_drop_to_20_w(eng, from_second=10 + 3 * n) == [20.0]  # watched again


def test_a_sum_of_sub_rails_is_not_held_against_a_band_on_the_measured_total():
    """A garbled input rail ('VDD_IN NaNmW') left a line with the sum of VDD_SOC alone, 1.3 W against a band on
    VDD_IN."""
    eng = PolicyEngine(PolicyConfig(power_target_w=5.7, power_sustain_s=0.0))
    line = "RAM 3021/7620MB VDD_IN 5710mW/5710mW VDD_CPU_GPU_CV 1172mW/1172mW VDD_SOC 1528mW/1528mW"
    samples = [parse_line(line, t_s=0.0), parse_line("VDD_IN NaNmW/1mW VDD_SOC 1339mW/1339mW", t_s=1.0),
               parse_line(line, t_s=2.0)]
    assert samples[1].rails_sum_mw == 1339.0 and samples[1].total_mw is None
    assert [e for s in samples for e in eng.check_power(s)] == []


def test_a_watched_zone_is_named_as_the_sensors_name_it_and_one_no_reading_has_is_said_once():
    """temperature.zones: [CPU] matched no reading (the sensors name it cpu) and [cpu_x] (another board's zone, a typo)
    none either: the temperature rule watched nothing, without a word."""
    from edgekit.power.policy import READINGS_BEFORE_SENSOR_WARNING

    eng = PolicyEngine(PolicyConfig(temperature={"warn_c": 80, "critical_c": 90, "zones": ["CPU", "cpu_x"]}))
    assert eng.config.temperature.zones == ["cpu", "cpu_x"]
    hot = [PowerSample(t_s=float(i), source="tegrastats", temps_c={"cpu": 70.0 + 2 * i, "gpu": 99.0})
           for i in range(2 * READINGS_BEFORE_SENSOR_WARNING)]
    events = [e for s in hot for e in eng.check_temperatures(s)]
    said = [e for e in events if e.kind == "sensor"]
    assert len(said) == 1 and said[0].evidence["zones_missing"] == ["cpu_x"], said
    assert said[0].message.startswith(f"temperature.zones names cpu_x, which the first {READINGS_BEFORE_SENSOR_WARNING} "
                                      "readings of tegrastats did not have (they read cpu, gpu)")
    assert {e.evidence["zone"] for e in events if e.kind == "temperature"} == {"cpu"}  # CPU is watched; gpu is not


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
