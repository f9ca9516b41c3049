"""The grouped INT8 operator (a GGUF Q8_0 layout): its torch reference against an independent FP64 sum over the
groups, in every float dtype within the spec's tolerance, and exactly the float linear on the dequantized weights."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgekit.kernels.int8_group_layout import GROUP_SIZES, dequantize_int8_grouped, quantize_int8_grouped
from edgekit.kernels.linear import linear_reference
from edgekit.kernels.linear_w8a16_grouped import W8A16_GROUPED_SPEC, linear_w8a16_grouped_reference

sys.path.insert(0, str(Path(__file__).parent))
import fp64_oracle as oracle  # noqa: E402

DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _oracle(x, q, s, bias):
    """sum over groups of (x_g @ q_g.T) * s_g, in FP64: another order of the same products."""
    g = q.shape[1] // s.shape[1]
    x64, q64, s64 = x.to(torch.float64), q.to(torch.float64), s.to(torch.float64)
    y = sum((x64[..., j * g:(j + 1) * g] @ q64[:, j * g:(j + 1) * g].T) * s64[:, j] for j in range(s.shape[1]))
    return y + bias.to(torch.float64) if bias is not None else y


@settings(max_examples=16, deadline=None)
@given(m=st.integers(1, 5), n=st.integers(1, 40), groups=st.integers(1, 4), group=st.sampled_from(GROUP_SIZES),
       bias=st.booleans(), dt=st.sampled_from(list(DTYPES)), scale_fp32=st.booleans(), seed=st.integers(0, 2**16))
def test_reference_matches_an_fp64_group_sum(m, n, groups, group, bias, dt, scale_fp32, seed):
    g = torch.Generator().manual_seed(seed)
    k = groups * group
    w = torch.randn(n, k, generator=g) * (torch.rand(n, 1, generator=g) * 3 + 0.01)
    q, s = quantize_int8_grouped(w, group, torch.float32 if scale_fp32 else torch.float16)
    x = torch.randn(m, k, generator=g, dtype=torch.float64).to(DTYPES[dt])
    b = torch.randn(n, generator=g, dtype=torch.float64).to(DTYPES[dt]) if bias else None
    got = linear_w8a16_grouped_reference(x, q, s, b)
    assert got.dtype == x.dtype and got.shape == (m, n)
    tol = W8A16_GROUPED_SPEC.tolerance_for(dt)
    ok, ratio = oracle.within(got, _oracle(x, q, s, b), tol.atol, tol.rtol)
    assert ok, f"{dt}: error is {ratio:.2f}x the allowed {tol}"


def test_reference_is_the_float_linear_on_the_dequantized_weights_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    q, s = quantize_int8_grouped(torch.randn(48, 128, generator=g), 32)
    x = torch.randn(3, 128, generator=g)
    w = dequantize_int8_grouped(q, s)
    assert torch.equal(linear_w8a16_grouped_reference(x, q, s), linear_reference(x, w))
    assert torch.equal(w.reshape(48, 4, 32), q.float().reshape(48, 4, 32) * s.float()[..., None])  # exact products
