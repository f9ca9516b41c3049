"""Planting a layer that per-channel INT8 cannot represent, without changing the FP model."""

from __future__ import annotations

from dataclasses import replace

from edgekit.model.decoder import ModelWeights


def plant_sensitive_ffn(weights: ModelWeights, block: int) -> ModelWeights:
    """Make blocks.{block}.w_gate_up impossible to quantize per channel without changing the FP model.

    Input channel 0 of the layer is switched off by the norm in front of it (weight 0), and column 0
    of the layer gets values 1000x the rest: the FP output is unchanged (0 x anything = 0), but each
    row's INT8 scale is set by the outlier, so every other weight in the row rounds to zero and the
    block's feed-forward output is lost once quantized. The block's w_down is scaled up so that its
    feed-forward output matters next to the random embeddings (std 1) of the preset.
    """
    b = weights.blocks[block]
    lw = b.w_gate_up
    w = lw.weight.clone()  # (2F, C)
    w[:, 0] = 1000.0 * w.abs().max()
    norm = b.ffn_norm.clone()
    norm[0] = 0.0
    blocks = list(weights.blocks)
    blocks[block] = replace(b, ffn_norm=norm, w_gate_up=replace(lw, weight=w),
                            w_down=replace(b.w_down, weight=b.w_down.weight * 30.0))
    return replace(weights, blocks=blocks)
