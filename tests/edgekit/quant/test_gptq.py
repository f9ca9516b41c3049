"""GPTQ: on random layers with correlated inputs its output error is below round-to-nearest's, and the record
it returns is a valid linear_w4a16 record in kernels/int4_layout's format."""

from __future__ import annotations

import pytest
import torch

from edgekit.errors import QuantizationError
from edgekit.kernels.int4_layout import unpack_int4
from edgekit.quant.gptq import gptq_quantize
from edgekit.quant.int4_rounding import output_error, rtn_record


def correlated_inputs(seed: int, tokens: int, k: int) -> torch.Tensor:
    """Inputs (tokens, K) with correlated channels (a random mixing) and a few outlier channels, like LLM activations."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, k, generator=g) @ (torch.randn(k, k, generator=g) / k**0.5)
    x = x + 0.1 * torch.randn(tokens, k, generator=g)
    x[:, torch.randperm(k, generator=g)[:4]] *= 10.0
    return x


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_output_error_is_below_rtn(seed, group, symmetric, act_order):
    n, k = 96, 256
    x = correlated_inputs(seed, 1024, k)
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(100 + seed)) * 0.05
    h = (x.T @ x).to(torch.float64)
    rtn = rtn_record(w, None, group, symmetric, torch.float16)
    gq = gptq_quantize(w, h, group, symmetric=symmetric, act_order=act_order)
    # The property GPTQ exists for, measured directly on the inputs (not through H): ||X W^T - X Wq^T||.
    err_rtn = torch.linalg.norm(x @ w.T - x @ rtn.dequantized().T)
    err_gptq = torch.linalg.norm(x @ w.T - x @ gq.dequantized().T)
    assert err_gptq < 0.7 * err_rtn
    assert output_error(w - gq.dequantized(), h.float()) == pytest.approx(float(err_gptq) ** 2, rel=1e-3)


def test_record_is_in_the_int4_layout():
    n, k, group = 40, 192, 64
    x = correlated_inputs(3, 512, k)
    w = torch.randn(n, k) * 0.1
    bias = torch.randn(n)
    asym = gptq_quantize(w, x.T @ x, group, bias=bias)
    assert asym.op == "linear_w4a16" and asym.weight.dtype == torch.uint8 and asym.weight.shape == (n, k // 2)
    assert asym.scale.shape == (n, k // group) and asym.scale.dtype == torch.float16
    assert asym.offset.shape == (n, k // group) and asym.offset.dtype == torch.float16
    assert asym.bias is bias and asym.in_features == k
    sym = gptq_quantize(w, x.T @ x, group, symmetric=True)
    assert sym.offset is None
    codes = unpack_int4(sym.weight)
    assert int(codes.min()) >= 0 and int(codes.max()) <= 15
    # dequantizing the stored tensors gives weights close to the original (4 bits: within a few grid steps)
    step = sym.scale.float().repeat_interleave(group, dim=1)
    assert float(((sym.dequantized() - w).abs() / step).max()) < 8


def test_inputs_that_are_always_zero_zero_their_weights_and_stay_finite():
    n, k = 16, 64
    x = correlated_inputs(4, 256, k)
    x[:, 5] = 0.0  # a channel nothing ever drives (a norm weight of 0, say)
    w = torch.randn(n, k)
    w[:, 5] = 1000.0  # huge, but never multiplied by anything
    lw = gptq_quantize(w, x.T @ x, 32)
    deq = lw.dequantized()
    assert torch.isfinite(deq).all()
    # the dead column does not stretch its group's scale: the other weights keep a fine grid
    assert float(lw.scale.float().max()) < 1.0
    assert torch.linalg.norm(x @ (w - deq).T) < 0.5 * torch.linalg.norm(x @ w.T)


def test_bad_inputs_are_refused_with_the_expected_shape():
    w = torch.randn(8, 64)
    with pytest.raises(QuantizationError, match=r"expected \(64, 64\)"):
        gptq_quantize(w, torch.eye(32), 32)
    with pytest.raises(ValueError, match="group size 48"):
        gptq_quantize(w, torch.eye(64), 48)
