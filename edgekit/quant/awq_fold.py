"""Folding per-input-channel scales into the tensor that produces a layer's input, exactly.

For a layer whose weight columns are multiplied by s (edgekit.quant.awq), its
input must be divided by s. In a decoder block that division has a home for
every projection, so the FP model computes the same function before any
rounding (up to FP32 rounding of the scaled tensors):

- ``wqkv``: its input is rmsnorm(x) * attn_norm; divide attn_norm by s.
- ``w_gate_up``: the same with ffn_norm.
- ``w_down``: its input is silu(gate) * up, linear in up; divide the up rows
  (second half of w_gate_up, and their bias) by s.
- ``wo``: its input is the attention output, linear in V; divide the V rows of
  wqkv (and their bias) by the scale of the KV channel they produce. Heads that
  share a KV head read the same V channel, so wo's column scales are that
  channel's scale repeated for every such head (``wo_expand``).

The LM head is not scaled: its input comes from the final norm, but a tied
head shares its weight with the embedding table, which must not change.
A record that is already quantized (an INT4 layer taken in losslessly from a
GGUF file) is never changed, so no scale is folded into or out of it.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from edgekit.kernels.linear import LinearWeights
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import BlockWeights

# Where each layer's input scale is folded: the producer the division goes into.
PRODUCER = {"wqkv": "attn_norm", "w_gate_up": "ffn_norm", "w_down": "w_gate_up", "wo": "wqkv"}


def wo_expand(config: ModelConfig) -> torch.Tensor:
    """(Hq * D,) index of the V channel (in Hkv * D) that each wo column reads."""
    d, per_kv = config.head_dim, config.n_heads // config.n_kv_heads
    head = torch.arange(config.n_heads).repeat_interleave(d) // per_kv  # (Hq D,) KV head of each column
    return head * d + torch.arange(d).repeat(config.n_heads)


def can_fold(block: BlockWeights, layer: str) -> bool:
    """Both the layer and the tensor its scale is folded into are floating point."""
    lw = getattr(block, layer)
    producer = getattr(block, PRODUCER[layer])
    return lw.op == "linear" and (not isinstance(producer, LinearWeights) or producer.op == "linear")


def _scale_rows(lw: LinearWeights, rows: slice, div: torch.Tensor) -> LinearWeights:
    w = lw.weight.clone()
    w[rows] = w[rows] / div[:, None]
    bias = None
    if lw.bias is not None:
        bias = lw.bias.clone()
        bias[rows] = bias[rows] / div
    return replace(lw, weight=w, bias=bias)


def _scale_cols(lw: LinearWeights, cols: torch.Tensor) -> LinearWeights:
    return replace(lw, weight=lw.weight * cols.to(lw.weight.dtype)[None, :])


def fold_scales(block: BlockWeights, config: ModelConfig, scales: dict[str, torch.Tensor]) -> BlockWeights:
    """A copy of ``block`` with each layer's input scale (``scales[layer]``, its searched parameters) folded in.

    ``scales["wo"]`` has one entry per V channel (Hkv * D); the others one per input channel.
    """
    b = block
    dt = b.attn_norm.dtype
    if "wqkv" in scales:
        s = scales["wqkv"]
        b = replace(b, attn_norm=b.attn_norm / s.to(dt), wqkv=_scale_cols(b.wqkv, s))
    if "w_gate_up" in scales:
        s = scales["w_gate_up"]
        b = replace(b, ffn_norm=b.ffn_norm / s.to(dt), w_gate_up=_scale_cols(b.w_gate_up, s))
    if "w_down" in scales:
        s = scales["w_down"]
        f = config.intermediate_size
        b = replace(b, w_gate_up=_scale_rows(b.w_gate_up, slice(f, 2 * f), s.to(b.w_gate_up.weight.dtype)),
                    w_down=_scale_cols(b.w_down, s))
    if "wo" in scales:
        s = scales["wo"]
        v0 = (config.n_heads + config.n_kv_heads) * config.head_dim
        b = replace(b, wqkv=_scale_rows(b.wqkv, slice(v0, v0 + s.numel()), s.to(b.wqkv.weight.dtype)),
                    wo=_scale_cols(b.wo, s[wo_expand(config)]))
    return b
