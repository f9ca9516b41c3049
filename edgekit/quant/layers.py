"""What quantization adds to the model's layer names (``edgekit.model.layers``): the scheme a record stores, and the
value a floating-point tensor keeps after storage."""

from __future__ import annotations

import torch

from edgekit.kernels.linear import LinearWeights
from edgekit.kernels.registry import OPERATORS


def precision_of(lw: LinearWeights, float_name: str) -> str:
    """The scheme name the plan uses (edgekit.plan.precision.LINEAR_SCHEMES): "w8a16", "w8a8" or the float name ("fp16")."""
    scheme = OPERATORS[lw.op].scheme
    return float_name if scheme == "fp16" else scheme


def round_through(t: torch.Tensor | None, storage_dtype: torch.dtype) -> torch.Tensor | None:
    """The value a floating-point tensor has after being stored as ``storage_dtype`` (kept in its own dtype)."""
    if t is None or not t.is_floating_point():
        return t
    return t.to(storage_dtype).to(t.dtype)
