"""Roofline predictions: the model's arithmetic, checked against hand computations and its own invariants."""

from __future__ import annotations

import dataclasses

import pytest

from edgekit.model.presets import preset_config
from edgekit.plan.precision import PrecisionPlan
from edgekit.measured_on import predicted_for
from edgekit.plan.roofline import decode_estimate, prefill_estimate, roofline_table
from edgekit.plan.targets import load_target


def test_decode_step_streams_every_weight_once():
    cfg = preset_config("smollm2-135m")
    t = load_target("orin-nano-8gb")
    mode = t.power_mode("25W")
    pp = PrecisionPlan.uniform(cfg)
    est = decode_estimate(cfg, pp, t, mode, batch=1, kv_len=128, n_kernels=450)
    # tied embeddings: the LM head reads the embedding matrix, so every parameter is read once (fp16)
    kv = 2 * cfg.n_layers * cfg.n_kv_heads * 128 * cfg.head_dim * 2
    assert est.bytes == 2 * cfg.n_params + kv
    assert est.bound == "memory"
    expected = est.bytes / (mode.dram_bandwidth_gbps * 1e9 * t.roofline.bandwidth_efficiency)
    assert est.t_bound_s == pytest.approx(expected)
    assert est.n_kernels == 450
    assert est.t_s == pytest.approx(expected + est.n_kernels * t.roofline.kernel_overhead_us * 1e-6)


def test_int8_weights_speed_up_decode_and_energy_is_power_times_time():
    cfg = preset_config("qwen2.5-1.5b")
    t = load_target("agx-orin-64gb")
    r16 = roofline_table(cfg, PrecisionPlan.uniform(cfg, "fp16"), t, batch=1, context=2048, prefill_bucket=512,
                         kernel_counts=lambda mode: (400, 400))
    r8 = roofline_table(cfg, PrecisionPlan.uniform(cfg, "w8a16"), t, batch=1, context=2048, prefill_bucket=512,
                         kernel_counts=lambda mode: (400, 400))
    for a, b in zip(r16, r8):
        assert b["decode_short"]["tokens_per_s"] > 1.5 * a["decode_short"]["tokens_per_s"]
        d = a["decode_short"]
        assert d["energy_per_token_mj"] == pytest.approx(a["power_budget_w"] * d["time_per_token_ms"])
        assert a["label"] == predicted_for("agx-orin-64gb") == "predicted for agx-orin-64gb (roofline model; not measured)"


def test_modes_order_by_bandwidth_for_decode_and_by_compute_for_prefill():
    cfg = preset_config("llama-3.2-1b")
    t = load_target("agx-orin-64gb")
    pp = PrecisionPlan.uniform(cfg)
    m15, m30, m50 = (t.power_mode(n) for n in ("15W", "30W", "50W"))
    d15 = decode_estimate(cfg, pp, t, m15, batch=1, kv_len=512, n_kernels=400)
    d30 = decode_estimate(cfg, pp, t, m30, batch=1, kv_len=512, n_kernels=400)
    assert d30.t_memory_s == pytest.approx(d15.t_memory_s * m15.dram_bandwidth_gbps / m30.dram_bandwidth_gbps)
    p30 = prefill_estimate(cfg, pp, t, m30, batch=1, bucket=2048, n_kernels=400)
    p50 = prefill_estimate(cfg, pp, t, m50, batch=1, bucket=2048, n_kernels=400)
    assert p30.bound == p50.bound == "compute"
    assert p30.t_compute_s / p50.t_compute_s == pytest.approx(t.mode_scale(m50) / t.mode_scale(m30))


def test_longer_cache_slows_decode():
    cfg = preset_config("llama-3.2-1b")
    t = load_target("orin")
    rows = roofline_table(cfg, PrecisionPlan.uniform(cfg), t, batch=4, context=8192, prefill_bucket=1024,
                          kernel_counts=lambda mode: (400, 400))
    for r in rows:
        assert r["decode_full"]["tokens_per_s"] < r["decode_short"]["tokens_per_s"]


def test_kernel_count_comes_from_the_operators_launch_programs():
    from edgekit.graph.node import DECODE
    from edgekit.graph.paths import PER_OPERATOR
    from edgekit.kernels.variants import default_variants
    from edgekit.plan.launches import count_pass

    cfg = preset_config("smollm2-135m")

    def variants(op):
        return default_variants(op, head_dim=cfg.head_dim, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
                                hidden_size=cfg.hidden_size, rows=1)

    kw = dict(phase=DECODE, path=PER_OPERATOR, batch=1, tokens=1, context=2048)
    fp16 = count_pass(cfg, PrecisionPlan.uniform(cfg, "fp16"), variants, sm_count=16, max_shared_bytes=166912, **kw)
    n = cfg.n_layers
    # per block: 2 rmsnorm, fused qkv_rope, attention split + reduce (the split count is > 1 here), swiglu
    assert {k: v for k, v in fp16["operators"].items() if k != "linear"} == {
        "rmsnorm": 2 * n + 1, "qkv_rope": n, "attention_decode": 2 * n, "swiglu": n}
    # 3 GEMVs a block + the LM head, each a second launch when its program splits K (a 16-SM device: it does)
    assert 3 * n + 1 < fp16["operators"]["linear"] <= 2 * (3 * n + 1)
    # the glue between them: per block 2 residual adds and the cache write (slots + K + V); the embedding gather,
    # the RoPE rows (cos, sin) and the lengths once (tests/edgekit/plan/test_launches.py counts each glue op)
    assert fp16["glue"] == n * (2 + 3) + 1 + 2 + 1
    assert fp16["total"] == sum(fp16["operators"].values()) + fp16["glue"]
    # a device with many SMs wants split-K for the same shapes at least as often
    big = count_pass(cfg, PrecisionPlan.uniform(cfg, "fp16"), variants, sm_count=132, max_shared_bytes=232448, **kw)
    assert big["operators"]["linear"] >= fp16["operators"]["linear"]
    w8 = count_pass(cfg, PrecisionPlan.uniform(cfg, "w8a16"), variants, sm_count=16, max_shared_bytes=166912, **kw)
    # INT8 QKV cannot use the fused projection: a separate GEMV (and rope) per block
    assert w8["operators"]["rope"] == n and "qkv_rope" not in w8["operators"]
    assert w8["operators"]["linear_w8a16"] >= 4 * n and w8["operators"]["linear"] in (1, 2)


def test_sliding_window_layers_read_and_attend_only_their_window():
    cfg = preset_config("gemma-3-1b")  # 4 global layers, 22 local ones (window 512)
    t = load_target("orin-nano-8gb")
    mode, pp = t.power_mode("25W"), PrecisionPlan.uniform(cfg, "w4a16")
    long, short = (decode_estimate(cfg, pp, t, mode, batch=1, kv_len=n, n_kernels=0) for n in (4096, 512))
    per_position = 2 * cfg.n_kv_heads * cfg.head_dim * 2  # K and V of one layer, FP16
    assert long.bytes - short.bytes == 4 * (4096 - 512) * per_position  # past the window only global layers grow
    pre = prefill_estimate(cfg, pp, t, mode, batch=1, bucket=1024, n_kernels=0)
    full = prefill_estimate(dataclasses.replace(cfg, sliding_window=None), pp, t, mode, batch=1, bucket=1024,
                            n_kernels=0)
    hidden_pairs = 22 * (1024 - 512) ** 2 / 2  # query-key pairs the windows hide
    assert full.flops - pre.flops == pytest.approx(4 * cfg.n_heads * cfg.head_dim * hidden_pairs)
