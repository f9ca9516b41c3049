"""An INT8 KV cache with one static scale per (block, KV head), calibrated on the shipped text.

Keys and values are stored as int8, k ~= q * scale[h], halving the cache's
bytes against FP16 (a quarter against FP32); the scales are FP32, 2 * Hkv per
block. Static per-head scales (rather than a scale per token) keep the decode
attention kernel's dequantization to one multiply per head, and cost no extra
memory per token. Values beyond the calibrated range are clipped to +-127: the
gate measures what that costs, since its teacher-forced pass attends to the
same round trip (``KVScales.roundtrip``) that a decode step reads from this
cache. (A prefill attends to the unrounded K/V of its own chunk and only
writes the rounded ones, so for prompt positions the gate is slightly
pessimistic; for generated tokens it is exact, see test_kv_int8.py.)

The decoder reaches the cache only through ``write_prefix``, ``write_token``
and ``layer``; ``layer(i)`` returns dequantized (k, v) for the reference
attention operator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgekit.errors import QuantizationError
from edgekit.kernels.dispatch import DispatchTable
from edgekit.kernels.linear import INT8_MAX, MIN_SCALE
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import Decoder, ModelWeights
from edgekit.model.kv_cache import StaticKVCache, layer_shapes, new_split_arrivals, ring_prefix


def scales_from_absmax(absmax: torch.Tensor) -> torch.Tensor:
    """Per-head scales (H,) fp32 from per-head max |x| (H,): never zero or non-finite."""
    a = absmax.to(torch.float64)
    if not bool(torch.isfinite(a).all()):
        raise QuantizationError(f"KV statistics contain non-finite values {a.tolist()}; expected finite maxima")
    return torch.where(a > 0, (a / INT8_MAX).clamp(min=MIN_SCALE), torch.ones_like(a)).to(torch.float32)


def quantize_kv(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, D) float, scale (H,) -> int8 (B, H, T, D), clipped to [-127, 127]."""
    s = scale.to(device=x.device, dtype=torch.float32)[None, :, None, None]  # (1, H, 1, 1)
    return torch.clamp(torch.round(x.to(torch.float32) / s), -INT8_MAX, INT8_MAX).to(torch.int8)


def dequantize_kv(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int8 (B, H, S, D), scale (H,) -> (B, H, S, D) in ``dtype``."""
    s = scale.to(device=q.device, dtype=torch.float32)[None, :, None, None]
    return (q.to(torch.float32) * s).to(dtype)


@dataclass
class KVScales:
    k: list[torch.Tensor]  # per block (Hkv,) fp32
    v: list[torch.Tensor]  # per block (Hkv,) fp32

    @classmethod
    def from_absmax(cls, k_absmax: list[torch.Tensor], v_absmax: list[torch.Tensor]) -> "KVScales":
        return cls([scales_from_absmax(a) for a in k_absmax], [scales_from_absmax(a) for a in v_absmax])

    def check(self, config: ModelConfig) -> None:
        want = (config.n_kv_heads,)
        if len(self.k) != config.n_layers or len(self.v) != config.n_layers:
            raise QuantizationError(
                f"KV scales for {len(self.k)}/{len(self.v)} blocks, expected {config.n_layers} (one per block)"
            )
        for i, (k, v) in enumerate(zip(self.k, self.v)):
            if tuple(k.shape) != want or tuple(v.shape) != want:
                raise QuantizationError(f"KV scales of block {i} have shapes {tuple(k.shape)}/{tuple(v.shape)}, expected {want}")
            if not (bool(torch.isfinite(k).all() and (k > 0).all()) and bool(torch.isfinite(v).all() and (v > 0).all())):
                raise QuantizationError(f"KV scales of block {i} must be positive and finite, got k={k.tolist()} v={v.tolist()}")

    def roundtrip(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What attention reads after (k, v) (B, Hkv, T, D) went through the INT8 cache: a ``kv_transform``."""
        return (
            dequantize_kv(quantize_kv(k, self.k[layer]), self.k[layer], k.dtype),
            dequantize_kv(quantize_kv(v, self.v[layer]), self.v[layer], v.dtype),
        )


class Int8KVCache(StaticKVCache):
    """Same interface as StaticKVCache; int8 storage, dequantized on read."""

    def __init__(self, config: ModelConfig, batch: int, max_seq_len: int, dtype: torch.dtype, device="cpu", *, scales: KVScales):
        # Not calling StaticKVCache.__init__: it would allocate the float buffers this class replaces.
        scales.check(config)
        shapes = layer_shapes(config, batch, max_seq_len)  # (B, Hkv, rows, D) a layer
        self.k = [torch.zeros(s, dtype=torch.int8, device=device) for s in shapes]
        self.v = [torch.zeros(s, dtype=torch.int8, device=device) for s in shapes]
        self.k_scale = [s.to(device) for s in scales.k]
        self.v_scale = [s.to(device) for s in scales.v]
        self.batch, self.max_seq_len, self.dtype = batch, max_seq_len, dtype
        self.split_arrivals = new_split_arrivals(config, batch, device)

    def write_prefix(self, layer: int, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor | None = None) -> None:
        k, v = ring_prefix(k, v, self.k[layer].shape[2], seq_lens)
        T = k.shape[2]
        self.k[layer][:, :, :T] = quantize_kv(k, self.k_scale[layer])
        self.v[layer][:, :, :T] = quantize_kv(v, self.v_scale[layer])

    def write_token(self, layer: int, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor) -> None:
        batch = torch.arange(self.batch, device=rows.device)
        self.k[layer][batch, :, rows] = quantize_kv(k, self.k_scale[layer])[:, :, 0]
        self.v[layer][batch, :, rows] = quantize_kv(v, self.v_scale[layer])[:, :, 0]

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            dequantize_kv(self.k[layer], self.k_scale[layer], self.dtype),  # (B, Hkv, S, D)
            dequantize_kv(self.v[layer], self.v_scale[layer], self.dtype),
        )

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v + self.k_scale + self.v_scale)


class Int8KVDecoder(Decoder):
    """A Decoder whose ``new_cache`` makes an Int8KVCache; everything else is the Decoder's."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, ops: DispatchTable | None = None, *, kv_scales: KVScales):
        super().__init__(config, weights, ops)
        kv_scales.check(config)
        self.kv_scales = kv_scales

    def new_cache(self, batch: int, max_seq_len: int) -> StaticKVCache:
        return Int8KVCache(self.config, batch, max_seq_len, self.dtype, self.device, scales=self.kv_scales)


def make_decoder(config: ModelConfig, weights: ModelWeights, ops: DispatchTable | None = None,
                 kv_scales: KVScales | None = None) -> Decoder:
    """A Decoder for (possibly quantized) weights, with an INT8 KV cache when scales are given."""
    if kv_scales is None:
        return Decoder(config, weights, ops)
    return Int8KVDecoder(config, weights, ops, kv_scales=kv_scales)
