"""The per-layer sensitivity ranking finds a planted sensitive layer and a broken quantized one."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from edgekit.kernels.linear import LinearWeights
from edgekit.quant.quantize import quantize_layers
from edgekit.quant.sensitivity import rank_layers

sys.path.insert(0, str(Path(__file__).parent))
from planting import plant_sensitive_ffn  # noqa: E402


def _windows(cfg, n=2, T=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, cfg.vocab_size, (1, T), generator=g) for _ in range(n)]


def test_ranking_finds_a_planted_sensitive_layer(tiny):
    cfg = tiny.config
    planted = "blocks.0.w_gate_up"
    fp = plant_sensitive_ffn(tiny.weights, 0)
    ranking = rank_layers(cfg, fp, quantize_layers(fp, "w8a16", None, 0.5, include_head=True), _windows(cfg))
    assert [r["rank"] for r in ranking] == list(range(1, len(ranking) + 1))
    assert len(ranking) == 4 * cfg.n_layers + 1
    assert ranking[0]["layer"] == planted, ranking[:3]
    assert ranking[0]["kl_nats"] > 100 * ranking[1]["kl_nats"]


def test_ranking_finds_a_broken_quantized_layer(tiny):
    """A quantizer bug in one layer (its scales 20x too large) tops the ranking of the quantized records."""
    cfg = tiny.config
    q = quantize_layers(tiny.weights, "w8a16", None, 0.5, include_head=False)
    broken = "blocks.0.wo"
    q[broken] = LinearWeights(q[broken].op, q[broken].weight, q[broken].bias, q[broken].scale * 20.0)
    ranking = rank_layers(cfg, tiny.weights, q, _windows(cfg))
    assert ranking[0]["layer"] == broken
    assert all(r["layer"] != "lm_head" for r in ranking)
