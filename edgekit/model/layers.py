"""Names for a model's projections (its layers), copies of ModelWeights with some replaced, and storage dtype names.

A layer is one ``LinearWeights`` record: ``blocks.{i}.wqkv``, ``blocks.{i}.wo``,
``blocks.{i}.w_gate_up``, ``blocks.{i}.w_down`` and ``lm_head``. These names
are used in calibration statistics, the sensitivity ranking, the report, the
safetensors file and the plan.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from edgekit.errors import ModelLoadError
from edgekit.kernels.linear import LinearWeights
from edgekit.model.decoder import ModelWeights
from edgekit.model.embedding import tied_embedding

BLOCK_LINEARS = ("wqkv", "wo", "w_gate_up", "w_down")
HEAD = "lm_head"


def layer_names(n_layers: int, include_head: bool = True) -> list[str]:
    names = [f"blocks.{i}.{k}" for i in range(n_layers) for k in BLOCK_LINEARS]
    return names + [HEAD] if include_head else names


def block_index(name: str) -> int | None:
    """The block a layer belongs to (None for the LM head)."""
    if name == HEAD:
        return None
    return int(name.split(".")[1])


def named_linears(weights: ModelWeights) -> dict[str, LinearWeights]:
    out = {f"blocks.{i}.{k}": lw for i, b in enumerate(weights.blocks) for k, lw in b.linears().items()}
    out[HEAD] = weights.lm_head
    return out


def with_layers(weights: ModelWeights, layers: dict[str, LinearWeights]) -> ModelWeights:
    """A shallow copy of ``weights`` with the named layers replaced (tensors are shared, not copied).

    A tied model stays tied: a new LM head record becomes the embedding too (a quantized head is read row by
    row for the lookup, edgekit.model.embedding), so the gate scores the one matrix both use."""
    known = set(layer_names(len(weights.blocks)))
    unknown = sorted(set(layers) - known)
    if unknown:
        raise ModelLoadError(f"unknown layer names {unknown}; expected names like blocks.0.wqkv or lm_head")
    blocks = []
    for i, b in enumerate(weights.blocks):
        changes = {k: layers[f"blocks.{i}.{k}"] for k in BLOCK_LINEARS if f"blocks.{i}.{k}" in layers}
        blocks.append(replace(b, **changes) if changes else b)
    head = layers.get(HEAD, weights.lm_head)
    emb = weights.tok_embeddings
    if HEAD in layers and weights.tied:
        emb = tied_embedding(head, emb.dtype)
    return ModelWeights(tok_embeddings=emb, blocks=blocks, norm=weights.norm, lm_head=head)


_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def dtype_name(dt: torch.dtype) -> str:
    """torch.float16 -> "fp16" (the names the plan and the manifest use)."""
    for k, v in _DTYPES.items():
        if v == dt:
            return k
    raise ModelLoadError(f"unsupported floating-point storage dtype {dt}; expected one of {', '.join(_DTYPES)}")


def dtype_from_name(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ModelLoadError(f"unknown storage dtype {name!r}; expected one of {', '.join(_DTYPES)}")
    return _DTYPES[name]
