"""Activation-aware per-input-channel scales for INT4 weights (AWQ, Lin et al., 2024), folded exactly.

A few input channels of an LLM layer carry much larger activations than the
rest, and the weights that multiply them matter most. Multiplying weight
column j by s_j > 1 before rounding gives those weights a finer grid relative
to their size; dividing the input by s_j keeps the product unchanged:

    x @ W.T = (x / s) @ (W * s).T

The division is folded into whatever produces x, so nothing is added at run
time (``fold.py`` does it exactly for each place the graph allows). The scales
come from a grid search over s = mean|x|^alpha (alpha in [0, 1), normalised
so that sqrt(max s * min s) = 1), each candidate scored by the output error
of the rounded layer on the calibration inputs, ||X W^T - X (Q(W s) / s)^T||^2
computed from H = X^T X (edgekit.quant.int4_rounding). alpha = 0 is plain
round-to-nearest, so the chosen scales never score worse than it.

``expand`` serves a layer whose input channels cannot all be scaled on their
own: wo reads the attention output, where the heads that share one KV head
all read the same V channels, so one scale per V channel is searched and
expanded to the wo columns of every head that reads it.
"""

from __future__ import annotations

import torch

from edgekit.quant.int4_rounding import fake_quant, output_error

ALPHAS = tuple(i / 20 for i in range(20))
MIN_ACTIVATION = 1e-4  # floor of mean|x| so that dead channels do not get s = 0


def search_scales(w: torch.Tensor, h: torch.Tensor, act_mean: torch.Tensor, group: int, symmetric: bool,
                  scale_dtype: torch.dtype, expand: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Scales (P,) for a weight (N, K) with H (K, K) and mean |input| per channel ``act_mean`` (P,).

    P = K, or the number of independent channels when ``expand`` (K,) maps each column to one of them.
    Returns the scales and {"alpha", "error", "rtn_error"} (output errors on the calibration inputs).
    """
    wf = w.detach().to(torch.float32)
    hf = h.to(torch.float32)
    base = act_mean.to(torch.float32).clamp(min=MIN_ACTIVATION)
    best, best_err, best_alpha, rtn_err = torch.ones_like(base), float("inf"), 0.0, None
    for alpha in ALPHAS:
        s = base.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        cols = s if expand is None else s[expand]  # (K,)
        wq = fake_quant(wf * cols[None, :], group, symmetric, scale_dtype) / cols[None, :]
        err = output_error(wf - wq, hf)
        if alpha == 0.0:
            rtn_err = err
        if err < best_err:
            best, best_err, best_alpha = s, err, alpha
    return best, {"alpha": best_alpha, "error": best_err, "rtn_error": rtn_err}


def scaled_hessian(h: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """H of the inputs x / s: diag(1/s) H diag(1/s), for the layer whose weight columns were multiplied by s."""
    inv = 1.0 / cols.to(h.dtype)
    return h * inv[:, None] * inv[None, :]
