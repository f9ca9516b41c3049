"""Bytes of a quantized model as written, and bytes one decode step reads, with how the head and embedding are kept.

Floating-point tensors count at the storage dtype (FP16 by default) whatever
dtype they are held in during quantization (FP32); INT8 codes, packed INT4
codes and their scales/offsets count as they are. A tied matrix counts once.

A decode step reads every projection, the norms, the whole LM head and one
embedding row; these figures are computed from the weights (not measured),
and ``fp16_bytes_per_token`` is the same step with every weight in FP16, the
yardstick of "a quarter of FP16's".
"""

from __future__ import annotations

import torch

from edgekit.kernels.linear import LinearWeights
from edgekit.model.decoder import ModelWeights
from edgekit.model.embedding import QuantizedEmbedding
from edgekit.model.layers import HEAD, named_linears


def _size(dt: torch.dtype) -> int:
    return torch.tensor([], dtype=dt).element_size()


def tensor_bytes(t: torch.Tensor | None, dt: torch.dtype) -> int:
    """A float tensor at ``dt``; an integer one (codes) as it is."""
    if t is None:
        return 0
    return t.numel() * (_size(dt) if t.is_floating_point() else t.element_size())


def linear_bytes(lw: LinearWeights, dt: torch.dtype) -> int:
    """Weight (at ``dt`` if float), bias at ``dt``, and scales / offsets / smoothing vector in their own dtype."""
    n = tensor_bytes(lw.weight, dt) + tensor_bytes(lw.bias, dt)
    return n + sum(t.numel() * t.element_size() for t in (lw.scale, lw.smooth, lw.offset) if t is not None)


def _norm_bytes(weights: ModelWeights, dt: torch.dtype) -> int:
    return tensor_bytes(weights.norm, dt) + sum(tensor_bytes(t, dt) for b in weights.blocks for t in b.norms().values())


def model_bytes(weights: ModelWeights, dt: torch.dtype) -> int:
    """Bytes the weights take once written."""
    n = _norm_bytes(weights, dt)
    if not isinstance(weights.tok_embeddings, QuantizedEmbedding):  # a quantized tied table is the head's record
        n += tensor_bytes(weights.tok_embeddings, dt)
    for name, lw in named_linears(weights).items():
        if name == HEAD and weights.tied and lw.op == "linear":
            continue  # tied and floating point: the embedding tensor, counted above
        n += linear_bytes(lw, dt)
    return n


def embedding_row_bytes(weights: ModelWeights, dt: torch.dtype) -> int:
    emb = weights.tok_embeddings
    if isinstance(emb, QuantizedEmbedding):
        return emb.row_nbytes()
    return emb.shape[1] * _size(dt)


def bytes_per_token(weights: ModelWeights, dt: torch.dtype) -> int:
    """Weight bytes one decode step reads: every projection and the LM head, the norms, one embedding row."""
    return (sum(linear_bytes(lw, dt) for lw in named_linears(weights).values()) + _norm_bytes(weights, dt)
            + embedding_row_bytes(weights, dt))


def fp16_bytes_per_token(weights: ModelWeights) -> int:
    """``bytes_per_token`` of the same model with every weight in FP16 (INT4/INT8 layers at their full shape)."""
    n = sum(2 * lw.out_features * lw.in_features + tensor_bytes(lw.bias, torch.float16)
            for lw in named_linears(weights).values())
    return n + _norm_bytes(weights, torch.float16) + weights.tok_embeddings.shape[1] * 2


def _head_storage(lw: LinearWeights, dt: torch.dtype) -> str:
    if lw.op == "linear":
        return {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}.get(dt, str(dt))
    if lw.op == "linear_w4a16":
        g = lw.in_features // lw.scale.shape[1]
        return f"int4 g{g} ({'asymmetric' if lw.offset is not None else 'symmetric'}, {str(lw.scale.dtype).removeprefix('torch.')} scales)"
    if lw.op == "linear_w8a16_grouped":
        g = lw.in_features // lw.scale.shape[1]
        return f"int8 g{g} ({str(lw.scale.dtype).removeprefix('torch.')} scales, {lw.op})"
    return f"int8 per-row scale ({lw.op})"


def head_embedding_summary(weights: ModelWeights, dt: torch.dtype) -> dict:
    """How the LM head and the embedding are stored, their bytes, and the bytes per decoded token vs FP16."""
    head, emb = weights.lm_head, weights.tok_embeddings
    tied = weights.tied
    if isinstance(emb, QuantizedEmbedding):
        emb_storage = f"the lm_head matrix ({_head_storage(head, dt)}), rows dequantized on lookup"
    elif tied:
        emb_storage = f"{_head_storage(head, dt)} table, also the lm_head weight"
    else:
        emb_storage = f"{_head_storage(LinearWeights('linear', emb), dt)} table of its own"
    own_emb = 0 if isinstance(emb, QuantizedEmbedding) else tensor_bytes(emb, dt)
    per_token, fp16 = bytes_per_token(weights, dt), fp16_bytes_per_token(weights)
    return {
        "tied": tied,
        "lm_head": _head_storage(head, dt),
        "embedding": emb_storage,
        "lm_head_bytes": 0 if tied and head.op == "linear" else linear_bytes(head, dt),
        "embedding_bytes": own_emb,
        "bytes_per_token": per_token,
        "fp16_bytes_per_token": fp16,
        "vs_fp16": round(per_token / fp16, 4),
        "how": "computed from the stored weights: every projection and the LM head, the norms, one embedding row",
    }
