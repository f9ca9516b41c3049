"""Every torch reference agrees with an independent FP64 computation (fp64_oracle), on drawn shapes.

In FP64 the reference must agree to ~1e-9 (it is the golden-vector source); in
FP32/FP16/BF16 it must stay within its spec's per-dtype tolerance of the FP64
result computed from the same (rounded) inputs.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgekit.kernels import attention, geglu, linear, qk_norm_rope, rmsnorm, rope, swiglu

sys.path.insert(0, str(Path(__file__).parent))
import fp64_oracle as oracle  # noqa: E402

SETTINGS = settings(max_examples=12, deadline=None)
DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
dtype_names = st.sampled_from(list(DTYPES))


def _tol(spec, dtype_name):
    return spec.tolerance_for(dtype_name)


def _assert_close(got, want, spec, dtype_name):
    tol = _tol(spec, dtype_name)
    ok, ratio = oracle.within(got, want, tol.atol, tol.rtol)
    assert ok, f"{spec.name} {dtype_name}: error is {ratio:.2f}x the allowed {tol}"


def _rand(g, shape, dtype, scale=1.0):
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)


@SETTINGS
@given(rows=st.integers(1, 7), cols=st.integers(1, 300), dt=dtype_names, seed=st.integers(0, 2**16))
def test_rmsnorm_reference(rows, cols, dt, seed):
    g = torch.Generator().manual_seed(seed)
    x, w = _rand(g, (rows, cols), DTYPES[dt]), _rand(g, (cols,), DTYPES[dt])
    _assert_close(rmsnorm.rmsnorm_reference(x, w, 1e-5), oracle.rmsnorm(x, w, 1e-5), rmsnorm.SPEC, dt)


@SETTINGS
@given(rows=st.integers(1, 7), f=st.integers(1, 257), dt=dtype_names, seed=st.integers(0, 2**16))
def test_swiglu_reference(rows, f, dt, seed):
    g = torch.Generator().manual_seed(seed)
    gu = _rand(g, (rows, 2 * f), DTYPES[dt], 2.0)
    _assert_close(swiglu.swiglu_reference(gu), oracle.swiglu(gu), swiglu.SPEC, dt)


@SETTINGS
@given(m=st.integers(1, 9), n=st.integers(1, 70), k=st.integers(1, 300), bias=st.booleans(), dt=dtype_names,
       seed=st.integers(0, 2**16))
def test_linear_references(m, n, k, bias, dt, seed):
    g = torch.Generator().manual_seed(seed)
    dtype = DTYPES[dt]
    x = _rand(g, (m, k), dtype)
    w = _rand(g, (n, k), dtype, 1.0 / k**0.5)
    b = _rand(g, (n,), dtype) if bias else None
    _assert_close(linear.linear_reference(x, w, b), oracle.linear(x, w, b), linear.LINEAR_SPEC, dt)
    q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    s = torch.rand(n, generator=g, dtype=torch.float32) / (127 * k**0.5)
    _assert_close(linear.linear_w8a16_reference(x, q, s, b), oracle.linear_w8a16(x, q, s, b), linear.W8A16_SPEC, dt)


@SETTINGS
@given(m=st.integers(1, 9), n=st.integers(1, 70), k=st.integers(1, 300), smooth=st.booleans(),
       seed=st.integers(0, 2**16))
def test_w8a8_reference_in_fp64(m, n, k, smooth, seed):
    # FP64 only: in lower precision a product landing on a .5 rounding tie may legitimately round the
    # other way than in FP64; the kernel is held to the reference computed in its own arithmetic.
    g = torch.Generator().manual_seed(seed)
    x = _rand(g, (m, k), torch.float64)
    q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    s = torch.rand(n, generator=g, dtype=torch.float64) / 127
    sm = torch.rand(k, generator=g, dtype=torch.float64) + 0.5 if smooth else None
    _assert_close(linear.linear_w8a8_reference(x, q, s, None, sm), oracle.linear_w8a8(x, q, s, None, sm),
                  linear.W8A8_SPEC, "float64")


def test_w8a8_all_zero_row_has_unit_scale():
    x = torch.zeros(2, 8, dtype=torch.float64)
    x[1] = torch.arange(8)
    xq, sx = linear.quantize_per_token(x)
    assert sx[0].item() == 1.0 and xq[0].abs().sum() == 0
    assert xq[1].max().item() == 127


gqa = st.sampled_from([1, 3, 4, 8])
head_dims = st.sampled_from([64, 128])


@settings(max_examples=8, deadline=None)
@given(b=st.integers(1, 2), hkv=st.integers(1, 2), ratio=gqa, d=head_dims, t=st.integers(1, 21), dt=dtype_names,
       data=st.data())
def test_attention_prefill_reference(b, hkv, ratio, d, t, dt, data):
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    dtype = DTYPES[dt]
    q, k, v = (_rand(g, (b, h, t, d), dtype) for h in (hkv * ratio, hkv, hkv))
    seq_lens = torch.tensor([data.draw(st.integers(1, t)) for _ in range(b)])
    _assert_close(attention.attention_prefill_reference(q, k, v, seq_lens),
                  oracle.attention_prefill(q, k, v, seq_lens), attention.PREFILL_SPEC, dt)


@settings(max_examples=8, deadline=None)
@given(b=st.integers(1, 3), hkv=st.integers(1, 2), ratio=gqa, d=head_dims, s=st.integers(1, 67), dt=dtype_names,
       data=st.data())
def test_attention_decode_reference(b, hkv, ratio, d, s, dt, data):
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    dtype = DTYPES[dt]
    q = _rand(g, (b, hkv * ratio, d), dtype)
    kc, vc = _rand(g, (b, hkv, s, d), dtype), _rand(g, (b, hkv, s, d), dtype)
    seq_lens = torch.tensor([data.draw(st.integers(1, s)) for _ in range(b)])
    _assert_close(attention.attention_decode_reference(q, kc, vc, seq_lens),
                  oracle.attention_decode(q, kc, vc, seq_lens), attention.DECODE_SPEC, dt)


@settings(max_examples=8, deadline=None)
@given(b=st.integers(1, 2), t=st.integers(1, 9), hkv=st.integers(1, 2), ratio=gqa, d=head_dims, c=st.integers(1, 70),
       bias=st.booleans(), dt=dtype_names, seed=st.integers(0, 2**16))
def test_rope_references(b, t, hkv, ratio, d, c, bias, dt, seed):
    g = torch.Generator().manual_seed(seed)
    dtype = DTYPES[dt]
    hq = hkv * ratio
    width = (hq + 2 * hkv) * d
    table = torch.float64 if dtype == torch.float64 else torch.float32
    cos, sin = rope.rope_frequencies(d, t + 3, 10000.0, table)
    pos = torch.randint(0, t + 3, (b, t), generator=g)
    cos, sin = cos[pos], sin[pos]  # (B, T, D/2): arbitrary positions, as in decode
    x = _rand(g, (b, t, c), dtype)
    w = _rand(g, (width, c), dtype, 1.0 / c**0.5)
    bq = _rand(g, (width,), dtype) if bias else None
    # The fused op rounds the projection to the activation dtype before rotating: the oracle gets the
    # same rounded projection, so the comparison isolates the rotation and the head split.
    qkv = linear.linear_reference(x, w, bq)
    for got, want in zip(rope.rope_reference(qkv, cos, sin, hq, hkv), oracle.rope(qkv, cos, sin, hq, hkv)):
        _assert_close(got, want, rope.ROPE_SPEC, dt)
    for got, want in zip(rope.qkv_rope_reference(x, w, bq, cos, sin, hq, hkv), oracle.qkv_rope(x, w, bq, cos, sin, hq, hkv)):
        # against the unrounded FP64 projection: rounding twice stays within the reduction tolerance
        _assert_close(got, want, rope.QKV_ROPE_SPEC, dt)


def test_oracle_is_not_the_reference():
    # The oracle must not import edgekit or torch (an independent computation, or the tests prove nothing).
    tree = ast.parse(Path(importlib.util.find_spec("fp64_oracle").origin).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "math", "numpy"}, imported


@pytest.mark.parametrize("dt", ["float16", "float32"])
def test_attention_prefill_padding_rows_follow_the_rule(dt):
    # Query rows past seq_len still attend to keys j <= i and j < seq_len (never to padding keys).
    g = torch.Generator().manual_seed(0)
    q, k, v = (_rand(g, (1, 2, 6, 64), DTYPES[dt]) for _ in range(3))
    seq_lens = torch.tensor([3])
    out = attention.attention_prefill_reference(q, k, v, seq_lens)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 3:] = 100.0  # padding keys: must not matter
    v2[:, :, 3:] = -100.0
    torch.testing.assert_close(attention.attention_prefill_reference(q, k2, v2, seq_lens), out)


@settings(max_examples=10, deadline=None)
@given(b=st.integers(1, 2), hkv=st.integers(1, 2), ratio=gqa, d=head_dims, t=st.integers(1, 21), dt=dtype_names,
       data=st.data())
def test_attention_prefill_with_a_sliding_window_matches_the_oracle(b, hkv, ratio, d, t, dt, data):
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    dtype = DTYPES[dt]
    q, k, v = (_rand(g, (b, h, t, d), dtype) for h in (hkv * ratio, hkv, hkv))
    seq_lens = torch.tensor([data.draw(st.integers(1, t)) for _ in range(b)])
    window = data.draw(st.integers(1, t))
    _assert_close(attention.attention_prefill_reference(q, k, v, seq_lens, None, window),
                  oracle.attention_prefill(q, k, v, seq_lens, None, window), attention.PREFILL_SPEC, dt)


def test_a_sliding_window_hides_older_keys_and_a_row_that_sees_none_is_zero():
    g = torch.Generator().manual_seed(3)
    q, k, v = (_rand(g, (1, 2, 8, 16), torch.float32) for _ in range(3))
    seq_lens = torch.tensor([3])
    out = attention.attention_prefill_reference(q, k, v, seq_lens, None, 2)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 0], v2[:, :, 0] = 50.0, -50.0  # key 0 is outside the window of queries 2..: must not matter there
    moved = attention.attention_prefill_reference(q, k2, v2, seq_lens, None, 2)
    torch.testing.assert_close(moved[:, :, 2:], out[:, :, 2:])
    assert not torch.equal(attention.attention_prefill_reference(q, k2, v2, seq_lens)[:, :, 2], out[:, :, 2])
    # rows 4..7 (padding, past their window of 2) see no key: zeros
    assert torch.isfinite(out).all() and torch.equal(out[:, :, 4:], torch.zeros_like(out[:, :, 4:]))


@SETTINGS
@given(b=st.integers(1, 2), t=st.integers(1, 9), hkv=st.integers(1, 2), ratio=gqa, d=head_dims, dt=dtype_names,
       seed=st.integers(0, 2**16))
def test_qk_norm_rope_reference_matches_the_oracle(b, t, hkv, ratio, d, dt, seed):
    g = torch.Generator().manual_seed(seed)
    dtype = DTYPES[dt]
    hq = hkv * ratio
    table = torch.float64 if dtype == torch.float64 else torch.float32
    cos, sin = rope.rope_frequencies(d, t + 3, 1e6, table)
    pos = torch.randint(0, t + 3, (b, t), generator=g)
    cos, sin = cos[pos], sin[pos]  # (B, T, D/2)
    qkv = _rand(g, (b, t, (hq + 2 * hkv) * d), dtype, 3.0)
    qn, kn = (1 + 0.3 * torch.randn(d, generator=g)).to(dtype), (1 + 0.3 * torch.randn(d, generator=g)).to(dtype)
    got = qk_norm_rope.qk_norm_rope_reference(qkv, qn, kn, cos, sin, hq, hkv, 1e-6)
    for x, want in zip(got, oracle.qk_norm_rope(qkv, qn, kn, cos, sin, hq, hkv, 1e-6)):
        _assert_close(x, want, qk_norm_rope.SPEC, dt)


def test_qk_norm_rope_normalizes_each_head_on_its_own():
    # Scaling one K head's input by 1000 leaves every output unchanged (RMSNorm is scale-free per head); V passes
    qkv = _rand(torch.Generator().manual_seed(5), (1, 3, (2 + 2 * 1) * 16), torch.float64)
    cos, sin = rope.rope_frequencies(16, 3, 10000.0, torch.float64)
    args = (torch.ones(16, dtype=torch.float64), torch.ones(16, dtype=torch.float64), cos[None], sin[None], 2, 1, 0.0)
    scaled = qkv.clone()
    scaled[..., 2 * 16:3 * 16] *= 1000.0  # the K head
    a, b = qk_norm_rope.qk_norm_rope_reference(qkv, *args), qk_norm_rope.qk_norm_rope_reference(scaled, *args)
    torch.testing.assert_close(a[1], b[1])
    torch.testing.assert_close(a[0], b[0])
    torch.testing.assert_close(a[2], qkv.view(1, 3, 4, 16)[:, :, 3:].transpose(1, 2))


@SETTINGS
@given(rows=st.integers(1, 5), f=st.integers(1, 70), dt=dtype_names, seed=st.integers(0, 2**16))
def test_geglu_reference_matches_the_oracle(rows, f, dt, seed):
    gu = _rand(torch.Generator().manual_seed(seed), (rows, 2 * f), DTYPES[dt], 3.0)
    _assert_close(geglu.geglu_reference(gu), oracle.geglu(gu), geglu.SPEC, dt)
