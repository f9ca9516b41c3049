"""The W8A8 reference's integer product (a float BLAS matmul) is bit-for-bit the int64 product."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgekit.kernels.linear import exact_int_matmul, linear_w8a8_reference, quantize_per_token
from edgekit.kernels.precision import accumulate_dtype


def _int64_reference(x, qw, scale, bias, smooth):
    """The same formula with the integer product in int64 (slow, obviously exact)."""
    acc = accumulate_dtype(x.dtype)
    xs = x.to(acc) if smooth is None else x.to(acc) / smooth.to(acc)
    xq, sx = quantize_per_token(xs)
    y = (xq.to(torch.int64) @ qw.to(torch.int64).T).to(acc) * sx.to(acc) * scale.to(acc)
    return (y if bias is None else y + bias.to(acc)).to(x.dtype)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 9999),
    rows=st.integers(1, 9),
    n=st.integers(1, 70),
    # both sides of the FP32-exact limit (K * 127^2 < 2^24 <=> K <= 1040)
    k=st.sampled_from([1, 7, 64, 576, 1040, 1041, 1536, 3000]),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16]),
    with_bias=st.booleans(),
    with_smooth=st.booleans(),
)
def test_bitwise_equal_to_the_int64_product(seed, rows, n, k, dtype, with_bias, with_smooth):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, k, generator=g) * 3).to(dtype)
    x[0, 0] = 40.0  # an outlier, as in real activations
    qw = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    qw[0] = 127  # the worst case for the accumulator: every product at its maximum
    scale = torch.rand(n, generator=g) + 0.01
    bias = torch.randn(n, generator=g).to(dtype) if with_bias else None
    smooth = torch.rand(k, generator=g) + 0.1 if with_smooth else None
    got = linear_w8a8_reference(x, qw, scale, bias, smooth)
    want = _int64_reference(x, qw, scale, bias, smooth)
    assert got.dtype == want.dtype
    assert torch.equal(got, want)


def test_all_max_products_stay_exact():
    k = 1040  # the largest K on the FP32 path: 1040 * 127^2 < 2^24
    xq = torch.full((1, k), 127, dtype=torch.int8)
    assert exact_int_matmul(xq, xq).dtype == torch.float32
    assert int(exact_int_matmul(xq, xq)) == k * 127 * 127
    xq = torch.full((1, k + 1), -127, dtype=torch.int8)
    assert exact_int_matmul(xq, xq).dtype == torch.float64
    assert int(exact_int_matmul(xq, xq)) == (k + 1) * 127 * 127
