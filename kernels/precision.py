"""Precision helpers shared by the torch references."""

from __future__ import annotations

import torch


def accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a reference accumulates in: FP64 stays FP64, everything else FP32.

    Never lower than FP32, so a reference is never less precise than a kernel.
    """
    return torch.float64 if dtype == torch.float64 else torch.float32


def rounded_to(value: float, dtype: torch.dtype) -> float:
    """A Python scalar rounded to ``dtype`` and held as a Python float (exact): what a tensor of ``dtype`` is
    multiplied by when the reference implementations round a constant first (Gemma's embedding scale). A float, not
    a tensor: a tensor made on the device in a decode step is a host copy, which a CUDA graph capture refuses."""
    return torch.tensor(value, dtype=dtype).item()


def plain_ops_needed(*tensors: torch.Tensor | None) -> bool:
    """Whether a computation must take plain ops instead of writing into a buffer with ``out=``: under torch.compile
    (its functional form drops a buffer's layout) or where an input needs a gradient (``out=`` has no autograd)."""
    return torch.compiler.is_compiling() or (
        torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors))


def product_in(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``a * b`` computed in the inputs' common dtype and returned in ``out_dtype``: the product writes it (torch
    rounds once on the store, as a cast would), so a dequantization ends without a cast kernel; the same values as
    ``(a * b).to(out_dtype)``, which it takes where ``out=`` cannot serve."""
    if plain_ops_needed(a, b):
        return (a * b).to(out_dtype)
    shape = torch.broadcast_shapes(a.shape, b.shape)
    return torch.mul(a, b, out=torch.empty(shape, dtype=out_dtype, device=a.device))
