"""SmoothQuant factors: the formula, the degenerate channels, and the point of it (less INT8 error on outliers)."""

from __future__ import annotations

import pytest
import torch

from edgekit.errors import QuantizationError
from edgekit.kernels.linear import LinearWeights, linear_w8a8_reference
from edgekit.quant.smoothquant import smoothing_factors
from edgekit.quant.weights import quantize_linear


def test_factors_follow_the_formula():
    act = torch.tensor([4.0, 1.0, 9.0])
    w = torch.tensor([[1.0, -2.0, 0.5], [0.25, 1.0, -1.0]])  # column max |W| = 1, 2, 1
    s = smoothing_factors(act, w, alpha=0.5)
    want = torch.tensor([4.0**0.5 / 1.0**0.5, 1.0**0.5 / 2.0**0.5, 9.0**0.5 / 1.0**0.5])
    assert torch.allclose(s, want)
    assert torch.allclose(smoothing_factors(act, w, alpha=1.0), act)  # alpha 1: activations fully flattened


def test_dead_channels_get_factor_one():
    act = torch.tensor([0.0, 3.0, 2.0])
    w = torch.tensor([[1.0, 1.0, 0.0]])
    s = smoothing_factors(act, w, 0.5)
    assert s[0] == 1.0 and s[2] == 1.0 and s[1] > 0
    assert bool(torch.isfinite(s).all())


def test_bad_alpha_and_shapes_are_refused():
    with pytest.raises(QuantizationError, match=r"alpha must be in \[0, 1\]"):
        smoothing_factors(torch.ones(3), torch.ones(2, 3), 1.5)
    with pytest.raises(QuantizationError, match=r"expected \(3,\)"):
        smoothing_factors(torch.ones(4), torch.ones(2, 3), 0.5)


def test_smoothing_reduces_w8a8_error_on_outlier_channels():
    g = torch.Generator().manual_seed(0)
    K = 256
    w = torch.randn(64, K, generator=g) * 0.05
    x = torch.randn(32, K, generator=g)
    x[:, :4] *= 100.0  # a few outlier channels, as in LLM activations
    want = x @ w.T
    plain = quantize_linear(LinearWeights("linear", w), "w8a8", "l")
    s = smoothing_factors(x.abs().amax(dim=0), w, 0.5)
    smooth = quantize_linear(LinearWeights("linear", w), "w8a8", "l", s)
    err_plain = (linear_w8a8_reference(x, plain.weight, plain.scale) - want).norm() / want.norm()
    err_smooth = (linear_w8a8_reference(x, smooth.weight, smooth.scale, None, smooth.smooth) - want).norm() / want.norm()
    assert err_smooth < 0.5 * err_plain, (float(err_smooth), float(err_plain))
