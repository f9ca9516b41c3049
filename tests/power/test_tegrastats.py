"""tegrastats lines from several JetPack releases, and malformed or partial ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgekit.power.sensors.tegrastats import parse_line, replay_log

LOGS = Path(__file__).parent / "fixtures" / "tegrastats"


def test_agx_orin_jetpack51_rails_sum_and_timestamps():
    r = replay_log(LOGS / "agx-orin-64gb-jp51.log")
    assert len(r.samples) == 3 and r.skipped_lines == []
    s = r.samples[1]
    assert s.rails_mw == {"VDD_GPU_SOC": 3150.0, "VDD_CPU_CV": 14312.0, "VIN_SYS_5V0": 4968.0, "VDDQ_VDD2_1V8AO": 1091.0}
    assert s.total_mw is None and s.rails_sum_mw == 3150 + 14312 + 4968 + 1091  # AGX Orin has no VDD_IN
    assert s.rails_avg_mw["VDD_GPU_SOC"] == 2971.0 and s.rails_third_mw == {}
    assert s.emc_load_pct == 1 and s.emc_freq_mhz == 2133
    assert s.gpu_load_pct == 14 and s.gpu_freq_mhz == 407
    assert s.temps_c["gpu"] == 69.125 and s.temps_c["tj"] == 77.281 and "cv0" not in s.temps_c
    assert s.mem_used_mb == 13983 and s.mem_total_mb == 62780
    assert [x.t_s - r.samples[0].t_s for x in r.samples] == [0.0, 1.0, 2.0]
    assert s.to_dict()["time"] == "2025-11-21T08:49:48.000Z"
    assert r.samples[2].gpu_load_pct == 99 and r.samples[2].rails_mw["VDD_GPU_SOC"] == 18033


def test_orin_nx_jetpack50_without_timestamps_uses_the_interval():
    r = replay_log(LOGS / "orin-nx-16gb-jp50.log", interval_s=0.5)
    a, b = r.samples
    assert a.total_mw == 4286 and a.total_source == "VDD_IN"
    assert b.total_mw == 9874 and b.rails_mw["VDD_SOC"] == 2301
    assert (a.t_s, b.t_s) == (0.0, 0.5)
    assert "gpu" not in a.temps_c and b.temps_c["gpu"] == 46.5  # -256 C while the GPU was power-gated
    assert a.cpu_load_pct == pytest.approx(0.25)  # four cores online, "off" ones do not count
    assert b.gpu_load_pct == 61 and b.gpu_freq_mhz == 918


def test_orin_nano_jetpack6_lowercase_zones_and_bare_gr3d():
    a, b = replay_log(LOGS / "orin-nano-8gb-jp6.log").samples
    assert a.gpu_load_pct == 0 and a.gpu_freq_mhz is None
    assert a.temps_c == {"cpu": 46.093, "soc2": 45.093, "soc0": 45.343, "gpu": 46.406, "tj": 46.406, "soc1": 45.781}
    assert a.total_mw == 4370 and b.total_mw == 7912 and b.total_source == "VDD_IN"


def test_jetpack7_style_three_values_lowercase_names():
    (s,) = replay_log(LOGS / "jp7-style.log").samples
    assert s.rails_mw == {"vdd_gpu": 3012.0, "vdd_cpu_soc_mss": 7410.0, "vin": 21500.0}
    assert s.rails_avg_mw == {"vdd_gpu": 2980.0, "vdd_cpu_soc_mss": 7388.0, "vin": 21340.0}
    assert s.rails_third_mw == {"vdd_gpu": 3200.0, "vdd_cpu_soc_mss": 7702.0, "vin": 22100.0}
    # "vin" is not a known input rail name: no total, a sum that says what it adds
    assert s.total_mw is None and s.rails_sum_mw == 3012 + 7410 + 21500 and s.rails_sum_of == ["vdd_gpu", "vdd_cpu_soc_mss", "vin"]


def test_jetpack4_rails_without_units_and_pom_input_rail():
    (s,) = replay_log(LOGS / "xavier-nx-jp4.log").samples
    assert s.rails_mw == {"POM_5V_IN": 2027.0, "POM_5V_GPU": 0.0, "POM_5V_CPU": 321.0}
    assert s.total_mw == 2027 and s.total_source == "POM_5V_IN" and s.rails_sum_mw is None
    # PMIC@100C is a fixed placeholder on these boards (every real zone is at 24-31 C): not a temperature
    assert s.placeholder_temps_c == {"pmic": 100.0} and "pmic" not in s.temps_c and s.temps_c["thermal"] == 24.75
    assert "ram" not in s.rails_mw and "IRAM" not in s.rails_mw


def test_malformed_and_partial_lines():
    r = replay_log(LOGS / "malformed.log")
    # line 2 (an error message) and line 5 (punctuation and a bare ratio) carry nothing recognisable
    assert r.skipped_lines == [2, 5]
    by_line = r.samples
    full, truncated, ram_only, no_ts, bad_ts, temps_only, binary = by_line
    assert full.rails_sum_mw == 9000 + 12000 + 5000 + 1200 and full.total_mw is None
    # the line ends inside VIN_SYS_5V0's value and before VDDQ: those rails are missing, the rest kept
    assert truncated.rails_mw == {"VDD_GPU_SOC": 9100.0, "VDD_CPU_CV": 12000.0}
    assert truncated.rails_sum_of == ["VDD_GPU_SOC", "VDD_CPU_CV"]
    assert ram_only.rails_mw == {} and ram_only.total_mw is None and ram_only.mem_used_mb == 2448
    assert ram_only.cpu_load_pct is None  # the CPU list was cut off
    assert no_ts.total_mw == 4286 and no_ts.t_s == truncated.t_s + 2.0  # placed after the previous sample
    assert bad_ts.rails_mw == {"VDD_SOC": 1339.0}  # "NaNmW" is not a value; month 13 is not a date
    assert temps_only.temps_c == {"cpu": 45.312} and temps_only.total_mw is None
    assert binary.total_mw == 4000 and binary.rails_mw["VDD_SOC"] == 1200


@pytest.mark.parametrize("token", ["APE 174", "VIC_FREQ 729", "EMC_FREQ 1%@2133", "RAM 13983/62780MB", "SWAP 0/3810MB", "lfb 424x4MB"])
def test_non_rail_tokens_are_not_rails(token):
    s = parse_line(token + " VDD_IN 1000mW/1000mW", 0.0)
    assert s.rails_mw == {"VDD_IN": 1000.0}


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_never_crashes_on_arbitrary_text(text):
    s = parse_line(text, 0.0)
    if s is not None:
        assert all(v >= 0 for v in s.rails_mw.values())


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{2,12}", fullmatch=True), st.integers(0, 60000), min_size=1, max_size=6))
def test_rails_round_trip_through_a_printed_line(rails):
    rails = {k: v for k, v in rails.items() if k not in ("RAM", "SWAP", "IRAM", "LFB", "CACHED")}
    line = "RAM 1/2MB " + " ".join(f"{k} {v}mW/{v}mW" for k, v in rails.items())
    s = parse_line(line, 0.0)
    assert s.rails_mw == {k: float(v) for k, v in rails.items()}
    inputs = [k for k in ("VDD_IN", "POM_5V_IN") if k in rails]
    if inputs:
        assert s.total_mw == rails[inputs[0]] and s.rails_sum_mw is None
    elif rails:
        assert s.total_mw is None and s.rails_sum_mw == sum(rails.values())
