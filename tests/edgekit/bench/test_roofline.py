"""Roofline arithmetic: bytes per decoded token counted from the tensors equal the count from the shapes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from edgekit.bench.roofline import (
    decode_bytes, kv_bytes_per_token, mean_attended_len, roofline_fraction, roofline_tokens_per_s, weight_bytes_per_token,
)
from edgekit.bench.runner import _cast, quantized
from edgekit.model.presets import PRESETS
from edgekit.model.weights import random_weights

TINY = PRESETS["tiny"]
TINY_TIED = dataclasses.replace(TINY, architecture="llama", qkv_bias=False, tie_embeddings=True)


def _by_shapes(cfg, precision: str) -> int:
    """The same count written from the config alone: linears at 1 or 2 bytes (+ FP32 scale per row), the rest FP16
    (the embedding row INT8 when a tied head is)."""
    c = cfg.parameter_counts()
    rows = sum(o for o, _ in cfg.linear_shapes().values()) * cfg.n_layers  # one scale per output row
    blocks = c["blocks_linear"] * 2 if precision == "fp16" else c["blocks_linear"] * 1 + rows * 4
    head_params = cfg.vocab_size * cfg.hidden_size
    head = head_params * 2 if precision != "int8-head" else head_params + cfg.vocab_size * 4
    # a tied INT8 head is the embedding table: the looked-up row is C int8 codes + its FP32 scale
    row_of_embedding = cfg.hidden_size + 4 if precision == "int8-head" and cfg.tie_embeddings else cfg.hidden_size * 2
    return blocks + c["blocks_other"] * 2 + c["final_norm"] * 2 + head + row_of_embedding


@pytest.mark.parametrize("cfg", [TINY, TINY_TIED], ids=["untied", "tied"])
@pytest.mark.parametrize("precision", ["fp16", "int8", "int8-head"])
def test_weight_bytes_counted_from_tensors_match_the_shapes(cfg, precision):
    w = quantized(_cast(random_weights(cfg, seed=0), "cpu", torch.float16), precision)
    assert weight_bytes_per_token(w) == _by_shapes(cfg, precision)


def test_int8_reads_about_half_the_fp16_bytes_and_the_head_stays_fp16_by_default():
    w16 = _cast(random_weights(TINY, seed=0), "cpu", torch.float16)
    b16, b8, b8h = (weight_bytes_per_token(quantized(w16, p)) for p in ("fp16", "int8", "int8-head"))
    head16 = TINY.vocab_size * TINY.hidden_size * 2
    assert b8 - head16 < 0.55 * (b16 - head16)  # blocks: int8 + scales, well under the fp16 bytes
    assert b8 - b8h == head16 - (TINY.vocab_size * TINY.hidden_size + TINY.vocab_size * 4)


def test_kv_bytes_and_mean_attended_length():
    cfg = PRESETS["qwen2.5-1.5b"]
    # 28 layers x 2 KV heads x 128 dims x K and V x 2 bytes = 28672 bytes per position
    assert kv_bytes_per_token(cfg, 2048, 2.0) == 28672 * 2049
    steps = [128 + i + 1 for i in range(64)]  # step i attends positions [0, 128 + i]
    assert mean_attended_len(128, 64) == pytest.approx(sum(steps) / len(steps))


def test_a_sliding_window_layer_reads_at_most_its_window():
    cfg = PRESETS["gemma-3-1b"]  # 22 layers on a window of 512, 4 global; 1 KV head x 256 dims x K, V x 2 bytes
    assert kv_bytes_per_token(cfg, 2048, 2.0) == 1024 * (22 * 512 + 4 * 2048 + 26)
    assert kv_bytes_per_token(cfg, 100, 2.0) == 1024 * (26 * 100 + 26)


def test_roofline_ceiling_and_fraction():
    assert roofline_tokens_per_s(2_000_000_000, 4.0e12) == pytest.approx(2000.0)
    assert roofline_fraction(1500.0, 2_000_000_000, 4.0e12) == pytest.approx(0.75)
    with pytest.raises(ValueError):
        roofline_tokens_per_s(0, 4.0e12)


def test_decode_bytes_adds_weights_and_cache():
    w = _cast(random_weights(TINY, seed=0), "cpu", torch.float16)
    b = decode_bytes(TINY, w, attended_len=100.5, kv_bytes_per_element=2.0)
    assert b.total == weight_bytes_per_token(w) + kv_bytes_per_token(TINY, 100.5, 2.0)
    assert b.to_dict()["total"] == b.total
