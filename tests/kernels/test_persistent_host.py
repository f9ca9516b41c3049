"""The persistent decode kernel's host side without a GPU: its tiles are the fused operators' (per weight
precision), its work items per stage are what the staged launches cover, and bad operands are refused."""

from __future__ import annotations

import pytest
import torch

from edgekit.errors import OperatorError
from edgekit.kernels.fused_gemv_triton import gemv_tile
from edgekit.kernels.persistent_decode_triton import LayerWeights, layer_tiles, new_sync, persistent_layer, stage_items
from edgekit.kernels.variants import default_variants
from edgekit.model.presets import preset_config


def test_tiles_follow_the_fused_operators_per_weight_precision():
    cfg = preset_config("llama-3.2-1b")
    fp, w8 = layer_tiles(cfg).constexprs, layer_tiles(cfg, {"gate_up": True}).constexprs
    gu = default_variants("fused_norm_swiglu", head_dim=64, n_out=2 * cfg.intermediate_size, k_in=cfg.hidden_size)
    assert (fp["GU_BLOCK_N"], fp["GU_BLOCK_K"]) == (gu["norm_swiglu_fp"].constexprs["BLOCK_N"],
                                                    gu["norm_swiglu_fp"].constexprs["BLOCK_K"])
    assert (w8["GU_BLOCK_N"], w8["GU_BLOCK_K"]) == (gu["norm_swiglu_w8"].constexprs["BLOCK_N"],
                                                    gu["norm_swiglu_w8"].constexprs["BLOCK_K"])
    assert fp["QKV_PAIRS"] == w8["QKV_PAIRS"] and fp["O_BLOCK_N"] <= 4
    # stage 5 (down + residual) runs unstaged: the whole-K rule's tile, not the staged default's short K step
    rows, block_k, _ = gemv_tile({"n_out": cfg.hidden_size, "k_in": cfg.intermediate_size})
    down = default_variants("fused_proj_residual", head_dim=64, n_out=cfg.hidden_size, k_in=cfg.intermediate_size)
    assert down["proj_residual_fp"].num_stages > 1  # the fused operator's default stages at 1B (K = 8192)
    assert (fp["D_BLOCK_N"], fp["D_BLOCK_K"]) == (w8["D_BLOCK_N"], w8["D_BLOCK_K"]) == (rows, block_k)


def test_stage_items_cover_every_output():
    t = layer_tiles(preset_config("smollm2-135m")).constexprs
    items = stage_items(t, B=2, C=576, F=1536, n_heads=9, n_kv_heads=3, n_splits=6)
    half = t["HEAD_DIM"] // 2
    assert items[0] * t["QKV_PAIRS"] * 2 == 2 * (9 + 2 * 3) * 2 * half  # every q/k/v row of both sequences
    assert items[1] == 2 * 6 * 3 and items[2] * t["O_BLOCK_N"] >= 2 * 576 and items[3] * t["GU_BLOCK_N"] >= 2 * 1536


def test_a_layer_of_another_head_dim_is_refused():
    cfg = preset_config("smollm2-135m")  # head_dim 64
    C, F = cfg.hidden_size, cfg.intermediate_size
    h = torch.float16
    w = LayerWeights(torch.ones(C, dtype=h), torch.zeros(15 * 32, C, dtype=h), None, None, torch.zeros(C, 9 * 32, dtype=h),
                     None, None, torch.ones(C, dtype=h), torch.zeros(2 * F, C, dtype=h), None, torch.zeros(C, F, dtype=h),
                     None, None)
    cos = torch.zeros(16, 16)  # head_dim 32
    cache = torch.zeros(1, 3, 16, 32, dtype=h)
    with pytest.raises(OperatorError, match="head_dim 64; this layer has 32"):
        persistent_layer(torch.zeros(1, C, dtype=h), w, cos, cos, torch.zeros(1, dtype=torch.long),
                         torch.ones(1, dtype=torch.int32), cache, cache.clone(), new_sync("cpu"), eps=1e-5, sm_scale=0.1,
                         n_heads=9, n_kv_heads=3, tiles=layer_tiles(cfg))


def test_packed_int4_weights_are_refused_with_where_they_run():
    cfg = preset_config("smollm2-135m")
    C, F = cfg.hidden_size, cfg.intermediate_size
    h = torch.float16
    wgu = torch.zeros(2 * F, C // 2, dtype=torch.uint8)  # W4A16 gate/up: its stage runs float / INT8 code only
    w = LayerWeights(torch.ones(C, dtype=h), torch.zeros(15 * 64, C, dtype=h), None, None, torch.zeros(C, 9 * 64, dtype=h),
                     None, None, torch.ones(C, dtype=h), wgu, torch.ones(2 * F, C // 64, dtype=h),
                     torch.zeros(C, F, dtype=h), None, None)
    cos = torch.zeros(16, 32)
    cache = torch.zeros(1, 3, 16, 64, dtype=h)
    with pytest.raises(OperatorError, match=r"wgu are packed INT4 \(W4A16\); the persistent kernel takes float or INT8"):
        persistent_layer(torch.zeros(1, C, dtype=h), w, cos, cos, torch.zeros(1, dtype=torch.long),
                         torch.ones(1, dtype=torch.int32), cache, cache.clone(), new_sync("cpu"), eps=1e-5, sm_scale=0.1,
                         n_heads=9, n_kv_heads=3, tiles=layer_tiles(cfg))
