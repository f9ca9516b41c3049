"""The INT8 KV cache: per-head scales, the round-trip bound, and that the gate's teacher-forced round trip is what decode reads."""

from __future__ import annotations

import pytest
import torch

from edgekit.errors import QuantizationError
from edgekit.model.decoder import Decoder
from edgekit.model.kv_cache import StaticKVCache
from edgekit.quant.forward import all_logits
from edgekit.model.kv_int8 import Int8KVCache, KVScales, dequantize_kv, make_decoder, quantize_kv, scales_from_absmax


def test_scales_are_positive_and_finite_for_zero_and_huge_heads():
    s = scales_from_absmax(torch.tensor([0.0, 1e-44, 3.0e38, 2.54]))
    assert bool(torch.isfinite(s).all() and (s > 0).all())
    assert s[0] == 1.0 and torch.isclose(s[3], torch.tensor(0.02))
    with pytest.raises(QuantizationError, match="non-finite"):
        scales_from_absmax(torch.tensor([1.0, float("nan")]))


def test_round_trip_is_within_half_a_step_and_clips_beyond_the_calibrated_range():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 10, 16, generator=g) * torch.tensor([1.0, 5.0, 0.1])[None, :, None, None]  # (B, H, T, D)
    absmax = x.abs().amax(dim=(0, 2, 3))  # (H,)
    scale = scales_from_absmax(absmax)
    err = (dequantize_kv(quantize_kv(x, scale), scale, torch.float32) - x).abs()
    assert bool((err <= scale[None, :, None, None] / 2 + 1e-7).all())
    # a value twice the calibrated maximum saturates at 127 * scale
    y = x.clone()
    y[0, 1, 0, 0] = 2 * absmax[1]
    q = quantize_kv(y, scale)
    assert q[0, 1, 0, 0] == 127


def test_cache_stores_int8_and_takes_a_quarter_of_fp32(tiny):
    cfg = tiny.config
    scales = KVScales([torch.ones(cfg.n_kv_heads)] * cfg.n_layers, [torch.ones(cfg.n_kv_heads)] * cfg.n_layers)
    c8 = Int8KVCache(cfg, 2, 64, torch.float32, scales=scales)
    c32 = StaticKVCache(cfg, 2, 64, torch.float32)
    assert all(t.dtype == torch.int8 for t in c8.k + c8.v)
    assert c8.nbytes() == c32.nbytes() // 4 + 2 * cfg.n_layers * cfg.n_kv_heads * 4


def test_bad_scales_are_refused(tiny):
    cfg = tiny.config
    good = [torch.ones(cfg.n_kv_heads)] * cfg.n_layers
    with pytest.raises(QuantizationError, match="positive and finite"):
        KVScales(good, [torch.zeros(cfg.n_kv_heads)] * cfg.n_layers).check(cfg)
    with pytest.raises(QuantizationError, match="expected 2"):
        KVScales(good[:1], good[:1]).check(cfg)


def test_decode_through_the_int8_cache_matches_the_teacher_forced_round_trip(tiny):
    """Feeding every token through decode steps reads K/V back from the INT8 cache; the gate's
    teacher-forced pass applies the same round trip, so the two must agree to FP rounding."""
    cfg = tiny.config
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, cfg.vocab_size, (1, 24), generator=g)
    # calibrate the scales on a different sequence so some values clip
    calib = torch.randint(0, cfg.vocab_size, (1, 8), generator=g)
    from edgekit.quant.calibration import calibrate

    stats = calibrate(cfg, tiny.weights, [calib])
    scales = KVScales.from_absmax(stats.k_absmax, stats.v_absmax)
    dec = make_decoder(cfg, tiny.weights, kv_scales=scales)
    cache = dec.new_cache(1, 32)
    assert isinstance(cache, Int8KVCache)
    stepped = torch.stack([dec.decode(tokens[:, t], torch.tensor([t]), cache)[0] for t in range(tokens.shape[1])])
    forced = all_logits(Decoder(cfg, tiny.weights), tokens, kv_transform=scales.roundtrip)[0]  # (T, V)
    assert torch.allclose(stepped, forced, atol=1e-4, rtol=1e-4)
    # and the round trip is not a no-op: the FP cache gives different logits
    plain = all_logits(Decoder(cfg, tiny.weights), tokens)[0]
    assert not torch.allclose(plain, forced, atol=1e-6, rtol=0)
