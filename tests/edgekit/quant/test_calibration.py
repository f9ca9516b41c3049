"""Calibration records the real per-channel input ranges of every linear layer and the per-head K/V ranges."""

from __future__ import annotations

import pytest
import torch

from edgekit.errors import QuantizationError
from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.model.decoder import Decoder
from edgekit.quant.calibration import calibrate
from edgekit.quant.forward import embed, run_blocks
from edgekit.model.layers import layer_names


def test_statistics_match_a_direct_computation(tiny):
    cfg, w = tiny.config, tiny.weights
    g = torch.Generator().manual_seed(0)
    windows = [torch.randint(0, cfg.vocab_size, (1, n), generator=g) for n in (20, 13)]
    stats = calibrate(cfg, w, windows)
    assert set(stats.act_absmax) == set(layer_names(cfg.n_layers))
    assert stats.n_tokens == 33
    dec = Decoder(cfg, w)
    want_qkv = torch.zeros(cfg.hidden_size)
    want_head = torch.zeros(cfg.hidden_size)
    for t in windows:
        x = embed(dec, t)
        want_qkv = torch.maximum(want_qkv, rmsnorm_reference(x, w.blocks[0].attn_norm, cfg.rms_norm_eps).abs().amax(dim=(0, 1)))
        h = rmsnorm_reference(run_blocks(dec, x), w.norm, cfg.rms_norm_eps)
        want_head = torch.maximum(want_head, h.abs().amax(dim=(0, 1)))
    assert torch.allclose(stats.act_absmax["blocks.0.wqkv"], want_qkv)
    assert torch.allclose(stats.act_absmax["lm_head"], want_head)
    assert stats.act_absmax["blocks.1.w_down"].shape == (cfg.intermediate_size,)
    assert len(stats.k_absmax) == cfg.n_layers and stats.k_absmax[0].shape == (cfg.n_kv_heads,)
    assert bool((stats.v_absmax[1] > 0).all())


def test_no_windows_is_an_error(tiny):
    with pytest.raises(QuantizationError, match="at least one window"):
        calibrate(tiny.config, tiny.weights, [])
