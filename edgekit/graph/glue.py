"""Glue ops: the few steps between operators that are not swappable operators themselves.

The embedding gather, the RoPE tables a step reads, residual adds, KV-cache
writes (and, for sliding-window layers, the ring rows a decode step writes and
the lengths it attends to) and the reshapes between attention heads and rows. Each is declared once
here with its torch implementation; the planner counts the GPU kernels it launches by
running it on shape-only tensors (``graph.launch_count``: a view launches none); the ONNX
export maps each to standard ONNX ops (``export/onnx_glue.py``: one emitter per glue op).

An implementation takes the executor's context, the node and its resolved inputs
by role, and returns its outputs by role.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from edgekit.graph.node import DECODE
from edgekit.kernels.precision import rounded_to

Impl = Callable[[Any, Any, Mapping[str, Any]], dict]


@dataclass(frozen=True)
class GlueOp:
    name: str
    run: Impl
    side_effect: bool = False  # writes state (the KV cache): never removed as dead code
    doc: str = ""


def _embed(ctx, node, ins) -> dict:
    """Rows of the token table: (B, T) -> (B, T, C), (B,) -> (B, C); a quantized tied head dequantizes its rows."""
    table, tokens = ctx.weight(node.weights["table"]), ins["tokens"]
    if isinstance(table, torch.Tensor):  # index_select: advanced indexing launches a slower general gather on a GPU
        x = table.index_select(0, tokens.reshape(-1)).reshape(*tokens.shape, table.shape[-1])
    else:
        x = table[tokens]
    scale = node.attrs.get("scale")
    if scale is not None:  # rounded to the activation dtype first, as the reference implementations do
        x = x * rounded_to(scale, x.dtype)
    return {"x": x}


def _rope_tables(ctx, node, ins) -> dict:
    """cos/sin for this step's positions: (B, T, D/2) for a prefill of T tokens, (B, 1, D/2) for a decode step."""
    cos, sin = ctx.tables(node.attrs["rope"])  # (S, D/2), FP32 (FP64 in an FP64 run)
    tokens = ins["tokens"]
    if ctx.phase == DECODE:
        pos = ins["positions"]
        return {"cos": cos[pos][:, None], "sin": sin[pos][:, None]}
    B, T = tokens.shape
    return {"cos": cos[:T][None].expand(B, T, -1), "sin": sin[:T][None].expand(B, T, -1)}


def _seq_lens(ctx, node, ins) -> dict:
    """(B,) int32 attended lengths of a decode step, position + 1, in one kernel (the add writes int32)."""
    positions = ins["positions"]
    lens = torch.empty_like(positions, dtype=torch.int32)
    torch.add(positions, 1, out=lens)
    return {"seq_lens": lens}


def _kv_slots(ctx, node, ins) -> dict:
    """(B,) the ring row a decode step writes in a sliding-window layer's cache: position % window."""
    return {"slots": torch.remainder(ins["positions"], node.attrs["window"])}


def _window_lens(ctx, node, ins) -> dict:
    """(B,) int32 rows a decode step attends to in a sliding-window layer's ring: min(position + 1, window)."""
    positions = ins["positions"]
    lens = torch.empty_like(positions, dtype=torch.int32)
    torch.add(positions, 1, out=lens)
    return {"seq_lens": lens.clamp_(max=node.attrs["window"])}


def _as_tokens(ctx, node, ins) -> dict:
    return {"y": ins["x"][:, None]}  # (B, N) -> (B, 1, N): a decode step as a one-token sequence


def _select_token(ctx, node, ins) -> dict:
    return {"y": ins["x"][:, :, 0]}  # (B, H, 1, D) -> (B, H, D)


def _kv_store(ctx, node, ins) -> dict:
    """Write this layer's K and V into the cache; a prefill (and a calibration window) attends to what it returns.

    A decode step writes each sequence's token at its cache row ``slots`` (its position, or position % window in a
    sliding-window layer's ring); a sliding-window layer's prefill passes the sequence lengths, so a chunk longer
    than the ring keeps each sequence's last real positions (``model.kv_cache.ring_prefix``)."""
    k, v, layer = ins["k"], ins["v"], node.layer
    if ctx.kv_transform is not None:  # calibration: record, or the INT8 cache's round trip
        k, v = ctx.kv_transform(layer, k, v)
    if ctx.phase == DECODE:
        ctx.cache.write_token(layer, k, v, ins["slots"])
        return {}
    attended = k, v
    if ctx.kv_history is not None:  # a prompt's chunk attends to the row's positions before it as well: copied out
        past_k, past_v = ctx.kv_history(layer)  # before its own positions overwrite a sliding-window ring's oldest rows
        attended = torch.cat((past_k, k), dim=2), torch.cat((past_v, v), dim=2)
    if ctx.cache is not None:
        ctx.cache.write_prefix(layer, k, v, ins.get("seq_lens"))
    return {"k": attended[0], "v": attended[1]}


def _merge_heads(ctx, node, ins) -> dict:
    o = ins["x"]
    if o.dim() == 3:  # (B, Hq, D) -> (B, Hq D)
        return {"y": o.reshape(o.shape[0], -1)}
    B, H, T, D = o.shape  # (B, Hq, T, D) -> (B, T, Hq D)
    return {"y": o.transpose(1, 2).reshape(B, T, H * D)}


def _add(ctx, node, ins) -> dict:
    return {"y": ins["a"] + ins["b"]}


def _last_token(ctx, node, ins) -> dict:
    x, lens = ins["x"], ins["seq_lens"]  # (B, T, C), (B,)
    return {"y": x[torch.arange(x.shape[0], device=x.device), lens.to(x.device) - 1]}  # (B, C)


GLUE: dict[str, GlueOp] = {g.name: g for g in (
    GlueOp("embed", _embed, doc="token rows of the embedding table [x scale]"),
    GlueOp("rope_tables", _rope_tables,
           doc="the RoPE cos/sin rows of the step's positions (a decode step gathers them)"),
    GlueOp("seq_lens", _seq_lens, doc="position + 1 as int32"),
    GlueOp("kv_slots", _kv_slots, doc="a sliding-window layer's ring row: position % window"),
    GlueOp("window_lens", _window_lens,
           doc="a sliding-window layer's attended rows: min(position + 1, window)"),
    GlueOp("as_tokens", _as_tokens, doc="(B, N) as a one-token sequence (B, 1, N)"),
    GlueOp("select_token", _select_token, doc="(B, H, 1, D) -> (B, H, D)"),
    GlueOp("kv_store", _kv_store, side_effect=True,
           doc="K and V into the layer's cache (prefill: a prefix copy each; decode: the rows, one index_put each)"),
    GlueOp("merge_heads", _merge_heads, doc="heads back into rows"),
    GlueOp("add", _add, doc="a residual add"),
    GlueOp("last_token", _last_token, doc="each sequence's hidden state at its last real token"),
)}


def is_glue(op: str) -> bool:
    return op in GLUE
