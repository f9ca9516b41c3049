"""Precision helpers shared by the torch references."""

from __future__ import annotations

import torch


def accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a reference accumulates in: FP64 stays FP64, everything else FP32.

    Never lower than FP32, so a reference is never less precise than a kernel.
    """
    return torch.float64 if dtype == torch.float64 else torch.float32
