"""What the fused decode super-operators share: the projection they apply, in the per-operator path's arithmetic.

A fused operator's torch reference is the composition of the per-operator
references it replaces (rmsnorm, linear / linear_w8a16, rope, swiglu), so the
fused path and the per-operator path answer to the same definition. Weights
are floating point (``scale`` is None) or INT8 with a per-output-channel FP32
``scale`` (W8A16); INT4 will add a third case here.
"""

from __future__ import annotations

import torch

from edgekit.kernels.linear import linear_reference, linear_w8a16_reference
from edgekit.kernels.spec import FLOAT_DTYPES, TensorSpec

WEIGHT_DTYPES = FLOAT_DTYPES + ("int8",)


def weight_inputs(rows: str, cols: str, bias: bool = True) -> tuple[TensorSpec, ...]:
    """The weight, its optional INT8 scale and (optionally) bias, as every fused operator takes them."""
    specs = (TensorSpec("weight", f"({rows}, {cols})", WEIGHT_DTYPES),
             TensorSpec("scale", f"({rows},)", ("float32",), optional=True))
    return specs + ((TensorSpec("bias", f"({rows},)", FLOAT_DTYPES, optional=True),) if bias else ())


def project(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W.T (+ bias): ``linear`` for float weights, ``linear_w8a16`` for INT8 weights with a scale."""
    if scale is None:
        return linear_reference(x, weight, bias)
    return linear_w8a16_reference(x, weight, scale, bias)
