"""Per-output-channel symmetric INT8: round-trip bounds and scales that are never zero or non-finite."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgekit.errors import QuantizationError
from edgekit.kernels.linear import LinearWeights, linear_reference, linear_w8a8_reference, linear_w8a16_reference
from edgekit.quant.weights import MIN_SCALE, dequantize_per_channel, quantize_linear, quantize_per_channel

SETTINGS = settings(max_examples=40, deadline=None)


def _weight(seed: int, n: int, k: int, log10_scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 10.0**log10_scale


def _check_scales(scale: torch.Tensor) -> None:
    assert scale.dtype == torch.float32
    assert bool(torch.isfinite(scale).all()), scale
    assert bool((scale >= MIN_SCALE).all()), scale


@SETTINGS
@given(seed=st.integers(0, 10_000), n=st.integers(1, 40), k=st.integers(1, 300), log10_scale=st.floats(-30, 30))
def test_round_trip_error_is_at_most_half_a_step(seed, n, k, log10_scale):
    w = _weight(seed, n, k, log10_scale)
    q, scale = quantize_per_channel(w)
    assert q.dtype == torch.int8 and q.shape == w.shape and scale.shape == (n,)
    assert int(q.min()) >= -127  # symmetric: -128 is never used
    _check_scales(scale)
    # q is the nearest integer to w / s: |w - q s| <= s/2 exactly (products in FP64 are exact here)
    err = (q.double() * scale.double()[:, None] - w.double()).abs()  # (N, K)
    assert bool((err <= scale.double()[:, None] / 2).all()), float((err / scale.double()[:, None]).max())
    # and the FP32 dequantization adds only its own rounding: half an FP32 ulp of |q s| <= 127 s, 127 s 2^-24
    deq_err = (dequantize_per_channel(q, scale).double() - w.double()).abs()
    assert bool((deq_err <= scale.double()[:, None] * (0.5 + 127 * 2.0**-24)).all())
    # the largest value of each row uses the full range
    assert bool((q.abs().amax(dim=1) == 127).all())


def test_half_step_weights_round_to_the_nearest_integer():
    """A 4-bit GGUF grid puts weights at exactly half the row maximum: w / s is then a hair below 63.5
    (s is rounded to FP32), so the nearest integer is 63; an FP32 quotient rounds to the tie and gives 64."""
    w = torch.tensor([[1.1875, 0.59375, -0.59375]])
    q, scale = quantize_per_channel(w)
    assert float(w[0, 1].double() / scale.double()) < 63.5
    assert q.tolist() == [[127, 63, -63]]


def test_all_zero_rows_get_scale_one_and_dequantize_to_zero():
    w = torch.randn(4, 16)
    w[1] = 0.0
    w[3] = 0.0
    q, scale = quantize_per_channel(w)
    _check_scales(scale)
    assert scale[1] == 1.0 and scale[3] == 1.0
    assert bool((q[1] == 0).all()) and bool((dequantize_per_channel(q, scale)[1] == 0).all())


def test_huge_outliers_give_finite_scales_and_exact_outliers():
    fmax = torch.finfo(torch.float32).max
    w = torch.randn(3, 64)
    w[0, 5] = fmax  # the largest finite FP32 value
    w[1, 7] = -1e30
    w[2, :] = 1e-42  # subnormal: below MIN_SCALE * 127
    q, scale = quantize_per_channel(w)
    _check_scales(scale)
    deq = dequantize_per_channel(q, scale)
    assert bool(torch.isfinite(deq).all())
    assert q[0, 5] == 127 and q[1, 7] == -127
    assert torch.allclose(deq[0, 5].double(), torch.tensor(fmax, dtype=torch.float64), rtol=1e-6)
    assert scale[2] == MIN_SCALE and bool((q[2] == 0).all())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights_are_refused_with_their_position(bad):
    w = torch.randn(5, 8)
    w[2, 3] = bad
    with pytest.raises(QuantizationError, match=r"row 2, column 3"):
        quantize_per_channel(w, "blocks.0.wo")


def test_w8a16_record_matches_the_float_layer():
    g = torch.Generator().manual_seed(0)
    w, b, x = torch.randn(48, 32, generator=g) * 0.05, torch.randn(48, generator=g), torch.randn(7, 32, generator=g)
    lw = quantize_linear(LinearWeights("linear", w, b), "w8a16", "layer")
    assert lw.op == "linear_w8a16" and lw.weight.dtype == torch.int8 and lw.bias is b
    y = linear_w8a16_reference(x, lw.weight, lw.scale, lw.bias)
    want = linear_reference(x, w, b)
    # the error is bounded by the weight rounding: |x| . s/2 per output
    bound = (x.abs() @ torch.ones(32, 48)) * lw.scale / 2
    assert bool(((y - want).abs() <= bound + 1e-5).all())


def test_w8a8_smoothing_is_folded_into_the_weight_columns():
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(24, 16, generator=g) * 0.05, torch.randn(5, 16, generator=g)
    x[:, 3] *= 50.0  # an outlier channel
    smooth = torch.rand(16, generator=g) + 0.5
    lw = quantize_linear(LinearWeights("linear", w), "w8a8", "layer", smooth)
    assert lw.op == "linear_w8a8" and torch.equal(lw.smooth, smooth)
    # the record stands for the original weight: dequantized() folds the factors back out
    assert torch.allclose(lw.dequantized(), w, atol=float(lw.scale.max()))
    y = linear_w8a8_reference(x, lw.weight, lw.scale, None, lw.smooth)
    rel = (y - x @ w.T).norm() / (x @ w.T).norm()
    assert rel < 0.05


def test_quantize_linear_refuses_bad_inputs():
    lw = LinearWeights("linear", torch.randn(4, 4))
    with pytest.raises(QuantizationError, match="unknown quantization mode"):
        quantize_linear(lw, "w4a16", "x")
    with pytest.raises(QuantizationError, match="only apply to w8a8"):
        quantize_linear(lw, "w8a16", "x", torch.ones(4))
    q = quantize_linear(lw, "w8a16", "x")
    with pytest.raises(QuantizationError, match="already linear_w8a16"):
        quantize_linear(q, "w8a16", "x")
