"""SmoothQuant smoothing factors for W8A8 (Xiao et al., 2023).

Per-token INT8 activations lose precision when a few input channels carry
values far larger than the rest (LLM activations do: a handful of "outlier"
channels). SmoothQuant divides each input channel j by a factor s_j and
multiplies the matching weight column by it, which leaves the product
unchanged, (x / s) @ (W * s).T = x @ W.T, and moves part of the range from the
activations into the weights:

    s_j = max|X_j| ** alpha / max|W_j| ** (1 - alpha)

alpha = 0 leaves activations alone (s_j = 1 / max|W_j|: weights flattened),
alpha = 1 flattens activations completely; 0.5 balances the two and is the
usual default. The W8A8 operator takes s as its ``smooth`` input and divides
the activations itself, so nothing has to be folded into the preceding norm
and the factors also apply to ``wo`` and ``w_down``.
"""

from __future__ import annotations

import torch

from edgekit.errors import QuantizationError

# Keep factors in a range where x / s and W * s stay well inside FP32 and FP16.
MIN_FACTOR = 1e-5
MAX_FACTOR = 1e5


def smoothing_factors(act_absmax: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """Factors s (K,) fp32 for activations with per-channel max |x| ``act_absmax`` (K,) and a weight (N, K).

    A channel that is always zero in the activations or in the weight gets
    s = 1: there is nothing to balance, and 0 would divide by zero.
    """
    if not 0.0 <= alpha <= 1.0:
        raise QuantizationError(f"SmoothQuant alpha must be in [0, 1], got {alpha}", hint="0.5 is the usual choice")
    if act_absmax.shape != (weight.shape[1],):
        raise QuantizationError(
            f"activation statistics of shape {tuple(act_absmax.shape)} do not match a weight of shape {tuple(weight.shape)}; "
            f"expected ({weight.shape[1]},)"
        )
    a = act_absmax.to(torch.float64)  # (K,)
    w = weight.detach().to(torch.float64).abs().amax(dim=0)  # (K,) max |W| of each input column
    live = (a > 0) & (w > 0) & torch.isfinite(a) & torch.isfinite(w)
    s = torch.ones_like(a)
    s[live] = a[live].pow(alpha) / w[live].pow(1.0 - alpha)
    return s.clamp(MIN_FACTOR, MAX_FACTOR).to(torch.float32)
