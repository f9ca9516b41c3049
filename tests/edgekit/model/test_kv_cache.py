"""The static KV cache with sliding-window rings: a local layer keeps only its window, in row position % window,
and a prefill longer than the ring keeps each sequence's own last positions."""

from __future__ import annotations

import torch

from edgekit.model.kv_cache import StaticKVCache, ring_prefix
from edgekit.model.kv_int8 import Int8KVCache, KVScales
from edgekit.model.presets import preset_config


def test_local_layers_hold_a_ring_of_the_window_and_global_layers_every_position():
    cfg = preset_config("gemma-3-1b")
    cache = StaticKVCache(cfg, 1, 4096, torch.float16, "meta")
    rows = [k.shape[2] for k in cache.k]
    assert rows == [4096 if (i + 1) % 6 == 0 else 512 for i in range(26)]  # layers 5, 11, 17, 23 are global
    assert sum(t.numel() * 2 for t in cache.k + cache.v) == cfg.kv_cache_bytes(4096, 1, 2.0)
    short = StaticKVCache(cfg, 1, 100, torch.float16, "meta")  # a context shorter than the window: no ring bigger
    assert {k.shape[2] for k in short.k} == {100}
    llama = preset_config("smollm2-135m")
    assert {k.shape[2] for k in StaticKVCache(llama, 2, 300, torch.float16, "meta").k} == {300}


def _positions(B, H, T, D):
    """K whose every element is its own position, so what a ring row holds is readable."""
    return torch.arange(T, dtype=torch.float32)[None, None, :, None].expand(B, H, T, D).clone()


def test_a_long_prefill_keeps_each_sequences_last_real_positions_at_position_mod_window():
    k = _positions(3, 2, 10, 4)  # a bucket of 10; sequences of 10, 7 and 2 real tokens
    kept, _ = ring_prefix(k, k, 4, torch.tensor([10, 7, 2]))
    assert kept[:, 0, :, 0].tolist() == [[8, 9, 6, 7],  # positions 6..9: 8 % 4 = 0, 9 % 4 = 1, 6 % 4 = 2, 7 % 4 = 3
                                         [4, 5, 6, 3],  # positions 3..6 (the padding 7..9 is not kept)
                                         [0, 1, 2, 3]]  # only 0 and 1 are real; rows 2, 3 are never attended
    short = torch.randn(2, 2, 3, 4)
    assert ring_prefix(short, short, 4, None)[0] is short  # a chunk that fits is kept whole, in place


def test_decode_writes_the_ring_row_it_is_given_and_int8_rings_match():
    cfg = preset_config("tiny-gemma3")  # window 4 on layers 0 and 1, layer 2 global
    scales = KVScales([torch.ones(cfg.n_kv_heads)] * 3, [torch.ones(cfg.n_kv_heads)] * 3)
    for cache in (StaticKVCache(cfg, 1, 32, torch.float32), Int8KVCache(cfg, 1, 32, torch.float32, scales=scales)):
        k = _positions(1, cfg.n_kv_heads, 9, cfg.head_dim)
        cache.write_prefix(0, k, k, torch.tensor([9]))  # positions 5..8 in rows 1, 2, 3, 0
        cache.write_prefix(2, k, k, torch.tensor([9]))
        cache.write_token(0, k[:, :, :1] + 9, k[:, :, :1] + 9, torch.tensor([9 % 4]))  # position 9 into row 1
        ring, full = cache.layer(0)[0], cache.layer(2)[0]
        assert ring.shape[2] == 4 and ring[0, 0, :, 0].tolist() == [8, 9, 6, 7]
        assert full.shape[2] == 32 and full[0, 0, :9, 0].tolist() == list(range(9))
