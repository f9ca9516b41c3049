"""The faster W8A8 path used by calibration and the gate gives the reference's exact bits."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgekit.kernels.linear import linear_w8a8_reference
from edgekit.quant.exact_ops import evaluation_ops, linear_w8a8_exact


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
def test_bitwise_equal_to_the_reference(seed, rows, n, k, dtype, with_bias, with_smooth):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, k, generator=g) * 3).to(dtype)
    x[0, 0] = 40.0  # an outlier, as in real activations
    qw = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    qw[0] = 127  # the worst case for the accumulator: every product at its maximum
    scale = torch.rand(n, generator=g) + 0.01
    bias = torch.randn(n, generator=g).to(dtype) if with_bias else None
    smooth = torch.rand(k, generator=g) + 0.1 if with_smooth else None
    want = linear_w8a8_reference(x, qw, scale, bias, smooth)
    got = linear_w8a8_exact(x, qw, scale, bias, smooth)
    assert got.dtype == want.dtype
    assert torch.equal(got, want)


def test_evaluation_table_swaps_only_w8a8():
    ops = evaluation_ops()
    src = ops.sources()
    assert src["linear_w8a8"].startswith("reference (exact")
    assert all(v == "reference" for k, v in src.items() if k != "linear_w8a8")
