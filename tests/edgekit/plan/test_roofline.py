"""Roofline predictions: the model's arithmetic, checked against hand computations and its own invariants."""

from __future__ import annotations

import pytest

from edgekit.model.presets import preset_config
from edgekit.plan.precision import PrecisionPlan
from edgekit.plan.roofline import PREDICTED, decode_estimate, decode_kernels, prefill_estimate, roofline_table
from edgekit.plan.targets import load_target


def test_decode_step_streams_every_weight_once():
    cfg = preset_config("smollm2-135m")
    t = load_target("orin-nano-8gb")
    mode = t.power_mode("25W")
    pp = PrecisionPlan.uniform(cfg)
    est = decode_estimate(cfg, pp, t, mode, batch=1, kv_len=128, decode_splits=8)
    # tied embeddings: the LM head reads the embedding matrix, so every parameter is read once (fp16)
    kv = 2 * cfg.n_layers * cfg.n_kv_heads * 128 * cfg.head_dim * 2
    assert est.bytes == 2 * cfg.n_params + kv
    assert est.bound == "memory"
    expected = est.bytes / (mode.dram_bandwidth_gbps * 1e9 * t.roofline.bandwidth_efficiency)
    assert est.t_bound_s == pytest.approx(expected)
    assert est.n_kernels == decode_kernels(cfg, 8) == cfg.n_layers * 9 + 4
    assert est.t_s == pytest.approx(expected + est.n_kernels * t.roofline.kernel_overhead_us * 1e-6)


def test_int8_weights_speed_up_decode_and_energy_is_power_times_time():
    cfg = preset_config("qwen2.5-1.5b")
    t = load_target("agx-orin-64gb")
    r16 = roofline_table(cfg, PrecisionPlan.uniform(cfg, "fp16"), t, batch=1, context=2048, prefill_bucket=512, decode_splits=16)
    r8 = roofline_table(cfg, PrecisionPlan.uniform(cfg, "w8a16"), t, batch=1, context=2048, prefill_bucket=512, decode_splits=16)
    for a, b in zip(r16, r8):
        assert b["decode_short"]["tokens_per_s"] > 1.5 * a["decode_short"]["tokens_per_s"]
        d = a["decode_short"]
        assert d["energy_per_token_mj"] == pytest.approx(a["power_budget_w"] * d["time_per_token_ms"])
        assert a["label"] == PREDICTED


def test_modes_order_by_bandwidth_for_decode_and_by_compute_for_prefill():
    cfg = preset_config("llama-3.2-1b")
    t = load_target("agx-orin-64gb")
    pp = PrecisionPlan.uniform(cfg)
    m15, m30, m50 = (t.power_mode(n) for n in ("15W", "30W", "50W"))
    d15 = decode_estimate(cfg, pp, t, m15, batch=1, kv_len=512, decode_splits=16)
    d30 = decode_estimate(cfg, pp, t, m30, batch=1, kv_len=512, decode_splits=16)
    assert d30.t_memory_s == pytest.approx(d15.t_memory_s * m15.dram_bandwidth_gbps / m30.dram_bandwidth_gbps)
    p30 = prefill_estimate(cfg, pp, t, m30, batch=1, bucket=2048)
    p50 = prefill_estimate(cfg, pp, t, m50, batch=1, bucket=2048)
    assert p30.bound == p50.bound == "compute"
    assert p30.t_compute_s / p50.t_compute_s == pytest.approx(t.mode_scale(m50) / t.mode_scale(m30))


def test_longer_cache_slows_decode():
    cfg = preset_config("llama-3.2-1b")
    t = load_target("orin")
    rows = roofline_table(cfg, PrecisionPlan.uniform(cfg), t, batch=4, context=8192, prefill_bucket=1024, decode_splits=4)
    for r in rows:
        assert r["decode_full"]["tokens_per_s"] < r["decode_short"]["tokens_per_s"]
