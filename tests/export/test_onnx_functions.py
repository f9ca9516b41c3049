"""Each fallback function body, alone in a one-node graph run by onnxruntime, against its torch reference.

Random shapes and values (hypothesis, few examples); tolerance: the operator spec's own tolerance for the
input dtype (REDUCTION/ELEMENTWISE tables in kernels/spec.py), since the body is one more implementation.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from edgekit.export.onnx_functions import CUSTOM_OPS, DOMAIN, DOMAIN_VERSION, IR_VERSION, OPSET
from edgekit.kernels.attention import default_scale
from edgekit.kernels.int4_layout import quantize_int4_rtn
from edgekit.kernels.registry import OPERATORS
from edgekit.kernels.rope import rope_frequencies

ONNX_TYPES = {torch.float32: TensorProto.FLOAT, torch.float16: TensorProto.FLOAT16, torch.int8: TensorProto.INT8,
              torch.uint8: TensorProto.UINT8, torch.int64: TensorProto.INT64}
SETTINGS = settings(max_examples=8, deadline=None)


def run_op(name: str, inputs: dict[str, torch.Tensor | None], **attrs) -> list[np.ndarray]:
    """Run edgekit::<op> on ``inputs`` (None = absent optional input) through its fallback body."""
    op = CUSTOM_OPS[name]
    given_ = {k: v for k, v in inputs.items() if v is not None}
    present = frozenset(k for k in given_ if any(t.optional and t.name == k for t in op.spec.inputs))
    node = helper.make_node(op.op_type, op.node_inputs({k: (k if v is not None else None) for k, v in inputs.items()}),
                            [t.name for t in op.spec.outputs], domain=DOMAIN, plugin_version=op.plugin_version, **attrs)
    node.overload = op.overload(present)
    graph = helper.make_graph(
        [node], name,
        [helper.make_tensor_value_info(k, ONNX_TYPES[v.dtype], list(v.shape)) for k, v in given_.items()],
        # every output has the activation dtype of the first input
        [helper.make_tensor_value_info(t.name, ONNX_TYPES[given_[op.spec.inputs[0].name].dtype], None)
         for t in op.spec.outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)],
                              functions=[op.function(present)])
    model.ir_version = IR_VERSION
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {k: v.numpy() for k, v in given_.items()})


def assert_matches(name: str, got: np.ndarray, want: torch.Tensor) -> None:
    tol = OPERATORS[name].spec.tolerance_for(str(want.dtype).removeprefix("torch."))
    assert got.dtype == want.numpy().dtype
    np.testing.assert_allclose(got.astype(np.float64), want.double().numpy(), atol=tol.atol, rtol=tol.rtol)


dtypes = st.sampled_from([torch.float32, torch.float16])


def randn(g: torch.Generator, *shape: int, dtype=torch.float32, std: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=g) * std).to(dtype)


@SETTINGS
@given(rows=st.integers(1, 5), C=st.integers(1, 96), dtype=dtypes, seed=st.integers(0, 2**16))
def test_rmsnorm(rows, C, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x, w = randn(g, 2, rows, C, dtype=dtype), randn(g, C, dtype=dtype)
    (y,) = run_op("rmsnorm", {"x": x, "weight": w}, eps=1e-6)
    assert_matches("rmsnorm", y, OPERATORS["rmsnorm"].reference(x, w, 1e-6))


@SETTINGS
@given(F=st.integers(1, 64), dtype=dtypes, seed=st.integers(0, 2**16))
def test_swiglu(F, dtype, seed):
    gate_up = randn(torch.Generator().manual_seed(seed), 2, 3, 2 * F, dtype=dtype, std=3.0)
    (y,) = run_op("swiglu", {"gate_up": gate_up})
    assert_matches("swiglu", y, OPERATORS["swiglu"].reference(gate_up))


@SETTINGS
@given(K=st.integers(1, 80), N=st.integers(1, 40), bias=st.booleans(), dtype=dtypes, seed=st.integers(0, 2**16))
def test_linear(K, N, bias, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x, w = randn(g, 2, 5, K, dtype=dtype), randn(g, N, K, dtype=dtype, std=K ** -0.5)
    b = randn(g, N, dtype=dtype) if bias else None
    (y,) = run_op("linear", {"x": x, "weight": w, "bias": b})
    assert_matches("linear", y, OPERATORS["linear"].reference(x, w, b))


def int8_inputs(g, K, N, dtype):
    x = randn(g, 3, K, dtype=dtype)
    q = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    scale = torch.rand(N, generator=g) * 0.01 + 1e-3
    return x, q, scale


@SETTINGS
@given(K=st.integers(1, 80), N=st.integers(1, 40), bias=st.booleans(), dtype=dtypes, seed=st.integers(0, 2**16))
def test_linear_w8a16(K, N, bias, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x, q, scale = int8_inputs(g, K, N, dtype)
    b = randn(g, N, dtype=dtype) if bias else None
    (y,) = run_op("linear_w8a16", {"x": x, "qweight": q, "scale": scale, "bias": b})
    assert_matches("linear_w8a16", y, OPERATORS["linear_w8a16"].reference(x, q, scale, b))


@SETTINGS
@given(K=st.integers(1, 80), N=st.integers(1, 40), bias=st.booleans(), smooth=st.booleans(), dtype=dtypes,
       seed=st.integers(0, 2**16))
def test_linear_w8a8(K, N, bias, smooth, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x, q, scale = int8_inputs(g, K, N, dtype)
    x[1] = 0  # an all-zero token: scale 1, output = bias
    b = randn(g, N, dtype=dtype) if bias else None
    s = torch.rand(K, generator=g) * 1.5 + 0.5 if smooth else None
    (y,) = run_op("linear_w8a8", {"x": x, "qweight": q, "scale": scale, "bias": b, "smooth": s})
    assert_matches("linear_w8a8", y, OPERATORS["linear_w8a8"].reference(x, q, scale, b, s))


@SETTINGS
@given(groups=st.integers(1, 4), group=st.sampled_from([32, 64, 128]), N=st.integers(1, 40), symmetric=st.booleans(),
       scale_dtype=st.sampled_from([torch.float16, torch.float32]), bias=st.booleans(), dtype=dtypes,
       seed=st.integers(0, 2**16))
def test_linear_w4a16(groups, group, N, symmetric, scale_dtype, bias, dtype, seed):
    # the body unpacks GGML's nibble order and applies group scales (and offsets) with standard ops only
    g = torch.Generator().manual_seed(seed)
    K = group * groups
    x = randn(g, 2, 3, K, dtype=dtype)
    q, scale, offset = quantize_int4_rtn(randn(g, N, K, std=K ** -0.5), group, symmetric=symmetric,
                                         scale_dtype=scale_dtype)
    b = randn(g, N, dtype=dtype) if bias else None
    (y,) = run_op("linear_w4a16", {"x": x, "qweight": q, "scale": scale, "offset": offset, "bias": b})
    assert_matches("linear_w4a16", y, OPERATORS["linear_w4a16"].reference(x, q, scale, offset, b))


def rope_tables(B, T, D):
    cos, sin = rope_frequencies(D, T, 10000.0)
    return cos[None].expand(B, T, -1).contiguous(), sin[None].expand(B, T, -1).contiguous()


@SETTINGS
@given(T=st.integers(1, 12), kv=st.integers(1, 3), group=st.integers(1, 3), half=st.integers(1, 8), dtype=dtypes,
       seed=st.integers(0, 2**16))
def test_rope_and_qkv_rope(T, kv, group, half, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    Hq, D, B = kv * group, 2 * half, 2
    cos, sin = rope_tables(B, T, D)
    qkv = randn(g, B, T, (Hq + 2 * kv) * D, dtype=dtype)
    outs = run_op("rope", {"qkv": qkv, "cos": cos, "sin": sin}, n_heads=Hq, n_kv_heads=kv)
    for got, want in zip(outs, OPERATORS["rope"].reference(qkv, cos, sin, Hq, kv)):
        assert_matches("rope", got, want)
    C = 24
    x, w, b = randn(g, B, T, C, dtype=dtype), randn(g, (Hq + 2 * kv) * D, C, dtype=dtype, std=0.2), None
    if seed % 2:
        b = randn(g, (Hq + 2 * kv) * D, dtype=dtype)
    outs = run_op("qkv_rope", {"x": x, "wqkv": w, "bqkv": b, "cos": cos, "sin": sin}, n_heads=Hq, n_kv_heads=kv)
    for got, want in zip(outs, OPERATORS["qkv_rope"].reference(x, w, b, cos, sin, Hq, kv)):
        assert_matches("qkv_rope", got, want)


@SETTINGS
@given(T=st.integers(1, 16), kv=st.integers(1, 3), group=st.integers(1, 3), D=st.sampled_from([4, 16]), dtype=dtypes,
       data=st.data())
def test_attention_prefill(T, kv, group, D, dtype, data):
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    B, Hq = 2, kv * group
    q, k, v = randn(g, B, Hq, T, D, dtype=dtype), randn(g, B, kv, T, D, dtype=dtype), randn(g, B, kv, T, D, dtype=dtype)
    lens = torch.tensor([data.draw(st.integers(1, T)) for _ in range(B)])
    window = data.draw(st.integers(0, T))  # 0: full causal attention; else a sliding window (padding rows may see none)
    (o,) = run_op("attention_prefill", {"q": q, "k": k, "v": v, "seq_lens": lens}, scale=default_scale(D),
                  window=window)
    want = OPERATORS["attention_prefill"].reference(q, k, v, lens, None, window)
    # Rows at or beyond seq_lens are padding (never read), but the rule defines them too: compare all rows.
    assert_matches("attention_prefill", o, want)
