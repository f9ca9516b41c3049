"""Grouped-query attention: prefill (causal, with key padding) and decode over a static KV cache.

Masking rule shared by both ops: query position i of sequence b may attend to
key position j when j <= i (causal, prefill only) and j < seq_lens[b]
(padding / unused cache). Query rows at or beyond seq_lens[b] in a prefill are
padding: their output is defined by the same rule but is never used.
"""

from __future__ import annotations

import math

import torch

from edgekit.kernels.precision import accumulate_dtype
from edgekit.kernels.spec import FLOAT_DTYPES, REDUCTION_TOLERANCE, OpSpec, TensorSpec

PREFILL_SPEC = OpSpec(
    name="attention_prefill",
    abi_version=1,
    inputs=(
        TensorSpec("q", "(B, Hq, T, D)", FLOAT_DTYPES),
        TensorSpec("k", "(B, Hkv, T, D)", FLOAT_DTYPES),
        TensorSpec("v", "(B, Hkv, T, D)", FLOAT_DTYPES),
        TensorSpec("seq_lens", "(B,)", ("int32", "int64")),
    ),
    outputs=(TensorSpec("o", "(B, Hq, T, D)", FLOAT_DTYPES),),
    attributes=("scale",),
    tolerance=REDUCTION_TOLERANCE,
    doc="Causal GQA attention over one padded chunk; keys at or beyond seq_lens[b] are masked.",
)

DECODE_SPEC = OpSpec(
    name="attention_decode",
    abi_version=1,
    inputs=(
        TensorSpec("q", "(B, Hq, D)", FLOAT_DTYPES),
        TensorSpec("k_cache", "(B, Hkv, S, D)", FLOAT_DTYPES),
        TensorSpec("v_cache", "(B, Hkv, S, D)", FLOAT_DTYPES),
        TensorSpec("seq_lens", "(B,)", ("int32", "int64")),
    ),
    outputs=(TensorSpec("o", "(B, Hq, D)", FLOAT_DTYPES),),
    attributes=("scale",),
    tolerance=REDUCTION_TOLERANCE,
    doc="One query token per sequence against cache positions [0, seq_lens[b]).",
)


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def attention_prefill_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    B, Hq, T, D = q.shape
    Hkv = k.shape[1]
    acc = accumulate_dtype(q.dtype)
    scale = default_scale(D) if scale is None else scale
    # Group query heads by the KV head they read (h // G), so K and V are never copied per query head.
    qg = q.to(acc).view(B, Hkv, Hq // Hkv, T, D)  # (B, Hkv, G, T, D)
    kf, vf = k.to(acc)[:, :, None], v.to(acc)[:, :, None]  # (B, Hkv, 1, T, D)
    scores = (qg @ kf.transpose(-1, -2)) * scale  # (B, Hkv, G, T, T)
    pos = torch.arange(T, device=q.device)
    causal = pos[None, :] <= pos[:, None]  # (T, T): key j <= query i
    valid_key = pos[None, :] < seq_lens.to(q.device)[:, None]  # (B, T)
    allowed = causal[None, None, None] & valid_key[:, None, None, None, :]  # (B, 1, 1, T, T)
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return (probs @ vf).view(B, Hq, T, D).to(q.dtype)


def attention_decode_reference(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_lens: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    acc = accumulate_dtype(q.dtype)
    scale = default_scale(D) if scale is None else scale
    # Positions at or beyond every sequence's length are masked anyway. On the CPU read only up to the
    # longest (cheaper); on a GPU keep the full static length: reading the max would sync the host and
    # break CUDA-graph capture.
    S = int(seq_lens.max()) if q.device.type == "cpu" else k_cache.shape[2]
    kf, vf = k_cache[:, :, :S].to(acc), v_cache[:, :, :S].to(acc)  # (B, Hkv, S, D)
    qg = q.to(acc).view(B, Hkv, Hq // Hkv, D)  # (B, Hkv, G, D)
    scores = (qg @ kf.transpose(-1, -2)) * scale  # (B, Hkv, G, S)
    valid = torch.arange(S, device=q.device)[None, :] < seq_lens.to(q.device)[:, None]  # (B, S)
    probs = torch.softmax(scores.masked_fill(~valid[:, None, None, :], float("-inf")), dim=-1)
    return (probs @ vf).view(B, Hq, D).to(q.dtype)
