"""The W4A16 layout (kernels/int4_layout.py): GGML nibble order, exact dequantization, RTN bounds."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgekit.kernels.int4_layout import (SUBBLOCK, check_group, dequantize_int4, group_size, pack_int4,
                                         quantize_int4_rtn, unpack_int4)
from edgekit.kernels.linear import LinearWeights, linear_w4a16_reference


def test_nibble_order_is_ggml_q4():
    # element j of a 32-block sits in byte j's low nibble, element j + 16 in its high nibble
    q = torch.arange(32, dtype=torch.uint8).remainder(16).reshape(1, 32)
    q[0, 16:] = 15 - q[0, 16:]
    packed = pack_int4(q)
    assert packed.shape == (1, 16)
    for j in range(16):
        assert int(packed[0, j]) & 0x0F == int(q[0, j])
        assert int(packed[0, j]) >> 4 == int(q[0, j + 16])


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 5), blocks=st.integers(1, 8), seed=st.integers(0, 2**31 - 1))
def test_pack_unpack_roundtrip(n, blocks, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, blocks * SUBBLOCK), generator=g, dtype=torch.uint8)
    assert torch.equal(unpack_int4(pack_int4(q)), q)


@settings(max_examples=30, deadline=None)
@given(group=st.sampled_from([32, 64, 128]), groups=st.integers(1, 4), symmetric=st.booleans(),
       scale_dtype=st.sampled_from([torch.float16, torch.float32]), seed=st.integers(0, 2**31 - 1))
def test_rtn_error_within_half_a_step_and_dequant_exact_in_fp32(group, groups, symmetric, scale_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(6, group * groups, generator=g)
    q, s, off = quantize_int4_rtn(w, group, symmetric=symmetric, scale_dtype=scale_dtype)
    assert group_size(q, s) == group and s.dtype == scale_dtype
    d32 = dequantize_int4(q, s, off)
    d64 = dequantize_int4(q, s, off, dtype=torch.float64)
    if symmetric and scale_dtype == torch.float16:
        assert torch.equal(d32.to(torch.float64), d64)  # (q - 8) * fp16 scale is exact in FP32
    else:
        # FP32 roundings of q * scale and of the sum: a few ulps of the group's magnitude (~15 steps)
        bound = float(s.to(torch.float64).abs().max()) * 16 * 2**-22
        assert torch.allclose(d32.to(torch.float64), d64, rtol=0, atol=bound)
    step = s.to(torch.float32).repeat_interleave(group, dim=-1)
    # symmetric clamps the most negative value at code 0 = -8 steps (never beyond max|w|), so half a step bounds both
    assert ((d32 - w).abs() <= 0.5 * step * (1 + 1e-3) + 1e-6).all()


@settings(max_examples=30, deadline=None)
@given(group=st.sampled_from([32, 64, 128]), groups=st.integers(1, 3), symmetric=st.booleans(),
       scale_dtype=st.sampled_from([torch.float16, torch.float32]),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.float16]), seed=st.integers(0, 2**31 - 1))
def test_dequantize_is_the_layouts_formula_element_by_element(group, groups, symmetric, scale_dtype, dtype, seed):
    # the table gather and broadcast scales (few kernels: a tied embedding runs this every step) give exactly
    # q * scale + offset, or (q - 8) * scale, in the accumulation dtype, then rounded once to the asked dtype
    g = torch.Generator().manual_seed(seed)
    q, s, off = quantize_int4_rtn(torch.randn(5, group * groups, generator=g), group, symmetric=symmetric,
                                  scale_dtype=scale_dtype)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    codes, step = unpack_int4(q).to(acc), s.to(acc).repeat_interleave(group, dim=-1)
    expect = (codes - 8) * step if off is None else codes * step + off.to(acc).repeat_interleave(group, dim=-1)
    got = dequantize_int4(q, s, off, dtype=dtype)
    assert got.dtype == dtype and got.is_contiguous() and torch.equal(got, expect.to(dtype))
    rows = torch.tensor([3, 0, 3])
    lw = LinearWeights("linear_w4a16", q, scale=s, offset=off)
    assert torch.equal(lw.dequantized(rows, acc), expect[rows])  # a tied embedding's rows


@pytest.mark.parametrize("symmetric", [False, True])
def test_dequantize_traces_under_torch_compile_and_takes_gradients(symmetric):
    # the bench's compiled baseline runs the W4A16 reference under torch.compile, whose functional form once lost the
    # element-order buffer the eager path writes into ("cannot view ... strides"); the scale tuning differentiates it
    q, s, off = quantize_int4_rtn(torch.randn(8, 128, generator=torch.Generator().manual_seed(0)), 64,
                                  symmetric=symmetric)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: dequantize_int4(*a, dtype=torch.float16), fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(q, s, off), dequantize_int4(q, s, off, dtype=torch.float16))
    scale = s.float().requires_grad_()
    w = dequantize_int4(q, scale, off)
    (w * torch.arange(128.0)).sum().backward()
    assert torch.equal(w.detach(), dequantize_int4(q, s.float(), off)) and float(scale.grad.abs().sum()) > 0


def test_bad_groups_and_codes_are_refused():
    with pytest.raises(ValueError, match="group size 48"):
        check_group(96, 48)
    with pytest.raises(ValueError, match="K divisible"):
        check_group(96, 64)
    with pytest.raises(ValueError, match="0..15"):
        pack_int4(torch.full((1, 32), 16, dtype=torch.int32))


def test_linear_record_and_reference_agree_with_fp64():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 128, generator=g)
    q, s, off = quantize_int4_rtn(w, 64)
    lw = LinearWeights("linear_w4a16", q, scale=s, offset=off)
    assert (lw.in_features, lw.out_features) == (128, 8)
    x = torch.randn(3, 128, generator=g, dtype=torch.float64)
    expect = x @ dequantize_int4(q, s, off, dtype=torch.float64).T
    assert torch.allclose(linear_w4a16_reference(x, *lw.operator_args()), expect, rtol=0, atol=1e-12)
    assert lw.nbytes() == q.numel() + 2 * s.numel() + 2 * off.numel()
