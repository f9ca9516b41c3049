"""The grouped INT8 weight layout (W8A16 with a scale per group of G weights): GGML Q8_0 taken in bit for bit.

One projection's grouped INT8 weights are two tensors:

- ``qweight`` int8 (N, K): the codes, one per byte, in row order (no packing).
- ``scale`` (N, K/G), float16 or float32: one scale per group of G = 32, 64 or 128
  consecutive elements of a row; w = q * scale. G is not stored: G = K / scale.shape[1].

GGML's Q8_0 block (34 bytes: d fp16, then 32 int8 codes; w = d * q) is this
layout with G = 32 and fp16 scales: a GGUF Q8_0 tensor is split into its codes
and its scales with byte copies (``from_q8_0``), no dequantize-requantize.
q * scale (8 x 11 significant bits) is exact in FP32, so every kernel, reference
and exporter dequantizes to the same bits as gguf-py does (it computes d * q in
FP32 too).

Why not the per-channel INT8 format (``linear_w8a16``, one FP32 scale per row):
it cannot hold 32 scales per row without re-quantizing, which is what lossless
intake must not do. The cost is 2 bytes of scale per 32 weights (+6.25%).
"""

from __future__ import annotations

import numpy as np
import torch

from edgekit.kernels.precision import accumulate_dtype, product_in

GROUP_SIZES = (32, 64, 128)
Q8_0_BLOCK = 32  # weights per GGML Q8_0 block
Q8_0_BLOCK_BYTES = 2 + Q8_0_BLOCK  # fp16 d, then the codes


def group_size(qweight: torch.Tensor, scale: torch.Tensor) -> int:
    """G of a weight and its scales: K / scale.shape[-1] (one of GROUP_SIZES, dividing K)."""
    k, groups = qweight.shape[-1], scale.shape[-1]
    if groups == 0 or k % groups or k // groups not in GROUP_SIZES:
        raise ValueError(f"grouped INT8: K={k} with {groups} scales per row; expected K / groups in {GROUP_SIZES}")
    return k // groups


def dequantize_int8_grouped(qweight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weights (..., K) the codes stand for, computed in FP32 (FP64 if ``dtype`` is float64), returned in
    ``dtype``; any leading shape. The scales broadcast over the groups' view and the product writes ``dtype`` (torch
    computes it in the accumulation dtype and rounds once on the store, as a cast would): a tied Q8_0 embedding runs
    this on its rows every decode step."""
    acc = accumulate_dtype(dtype)
    g = group_size(qweight, scale)
    return product_in(qweight.unflatten(-1, (-1, g)), scale.to(acc)[..., None], dtype).flatten(-2)  # (..., K/G, G)


def from_q8_0(data: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """A GGUF Q8_0 tensor's raw blocks, uint8 (N, K/32 * 34), as (qweight int8 (N, K), scale fp16 (N, K/32)): byte copies."""
    n = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(n, -1, Q8_0_BLOCK_BYTES)
    scale = blocks[..., :2].copy().view(np.float16)[..., 0]  # (N, K/32)
    codes = blocks[..., 2:].copy().view(np.int8).reshape(n, -1)  # (N, K)
    return torch.from_numpy(codes), torch.from_numpy(np.ascontiguousarray(scale))


def quantize_int8_grouped(w: torch.Tensor, group: int = 32, scale_dtype: torch.dtype = torch.float16) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-to-nearest grouped INT8 of float weights (N, K), absmax per group (Q8_0's rule): for tests and golden
    vectors; intake never re-quantizes."""
    n, k = w.shape
    wg = w.to(torch.float32).reshape(n, k // group, group)
    scale = (wg.abs().amax(dim=-1) / 127.0).to(scale_dtype)  # (N, K/G), rounded to what is stored
    s = scale.to(torch.float32)[..., None]
    q = torch.where(s > 0, torch.round(wg / torch.where(s > 0, s, torch.ones_like(s))), torch.zeros_like(wg))
    return torch.clamp(q, -127, 127).to(torch.int8).reshape(n, k), scale
