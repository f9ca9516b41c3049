"""GPU: the Orin (sm_87) artifacts, loaded from their PTX with cuda-python on this GPU, compute the right results.

For every operator, the default variants of the Orin model shapes are
cross-compiled for sm_87 exactly as the build does, loaded with
``kernels.launcher`` (PTX JIT, since an sm_87 cubin cannot run on sm_90), run
through the same AOT launch program a plugin carries, and compared with the
FP64 oracle and with the JIT kernels. This is the proof the Orin plugins are
numerically right before any Orin runs them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from edgekit.kernels import attention, linear, rmsnorm, rope, swiglu
from edgekit.kernels.aot import compile_variant
from edgekit.kernels.variants import default_variants, op_program

sys.path.insert(0, str(Path(__file__).parent))
import fp64_oracle as oracle  # noqa: E402

pytestmark = pytest.mark.gpu
H = torch.float16
# SmolLM2-135M (d64, 9/3 heads) and Qwen2.5-1.5B (d128, 12/2 heads) shapes, at a decode and a prefill bucket
MODELS = {
    "smollm2-135m": dict(head_dim=64, n_heads=9, n_kv_heads=3, hidden_size=576, intermediate=1536),
    "qwen2.5-1.5b": dict(head_dim=128, n_heads=12, n_kv_heads=2, hidden_size=1536, intermediate=8960),
}


def _plugin(op: str, shape: dict, arch: int = 87, prefer: str = "ptx"):
    from edgekit.kernels.launcher import LoadedKernel, PluginOp

    variants = default_variants(op, **shape)
    kernels = {name: LoadedKernel.from_compiled(compile_variant(v, arch, budget_bytes=131072), prefer=prefer)
               for name, v in variants.items()}
    plugin = PluginOp(op, op_program(op, variants, aot=True), kernels)
    assert {k.loaded_from for k in kernels.values()} == {prefer}
    return plugin


def _close(spec, got, want):
    tol = spec.tolerance_for("float16")
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
    for g, w in zip(got, want):
        ok, ratio = oracle.within(g, w, tol.atol, tol.rtol)
        assert ok, f"{spec.name}: error is {ratio:.2f}x the allowed {tol}"


def _rand(shape, scale=1.0):
    return (torch.randn(shape, device="cuda") * scale).to(H)


@pytest.fixture(scope="module")
def jit():
    from edgekit.kernels.triton_backend import triton_ops

    return triton_ops()


OPS = ["rmsnorm", "swiglu", "linear", "linear_w8a16", "linear_w8a8", "qkv_rope", "attention"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("rows", [1, 200])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_sm87_ptx_plugin_matches_fp64_and_jit(model, rows, op, jit):
    """One operator of one Orin model at a decode (1 row) or prefill (200 rows) bucket."""
    torch.manual_seed(rows)
    m = MODELS[model]
    d, hq, hkv, c, f = m["head_dim"], m["n_heads"], m["n_kv_heads"], m["hidden_size"], m["intermediate"]
    shape = dict(head_dim=d, n_heads=hq, n_kv_heads=hkv, hidden_size=c, rows=rows)
    x = _rand((rows, c))
    if op == "rmsnorm":
        w = _rand((c,))
        out = _plugin("rmsnorm", shape)(x, w, 1e-6)
        _close(rmsnorm.SPEC, out, oracle.rmsnorm(x, w, 1e-6))
        torch.testing.assert_close(out, jit["rmsnorm"](x, w, 1e-6), atol=2e-3, rtol=2e-3)
    elif op == "swiglu":
        gu = _rand((rows, 2 * f), 2.0)
        _close(swiglu.SPEC, _plugin("swiglu", shape)(gu), oracle.swiglu(gu))
    elif op == "linear":
        wf, bias = _rand((f, c), c**-0.5), _rand((f,))
        _close(linear.LINEAR_SPEC, _plugin("linear", shape)(x, wf, bias), oracle.linear(x, wf, bias))
    elif op == "linear_w8a16":
        q8 = torch.randint(-128, 128, (f, c), device="cuda", dtype=torch.int8)
        s8 = torch.rand(f, device="cuda") / (100 * c**0.5)
        got = _plugin("linear_w8a16", shape)(x, q8, s8, None)
        _close(linear.W8A16_SPEC, got, oracle.linear_w8a16(x, q8, s8))
        torch.testing.assert_close(got, jit["linear_w8a16"](x, q8, s8, None), atol=1e-2, rtol=1e-2)
    elif op == "linear_w8a8":
        q8 = torch.randint(-127, 128, (f, c), device="cuda", dtype=torch.int8)
        s8 = torch.rand(f, device="cuda") / (100 * c**0.5)
        bias, sm = _rand((f,)), torch.rand(c, device="cuda") + 0.5
        _close(linear.W8A8_SPEC, _plugin("linear_w8a8", shape)(x, q8, s8, bias, sm),
               linear.linear_w8a8_reference(x.float(), q8, s8, bias.float(), sm))
    elif op == "qkv_rope":
        B, T = (rows, 1) if rows == 1 else (2, rows // 2)
        width = (hq + 2 * hkv) * d
        wqkv, bqkv = _rand((width, c), c**-0.5), _rand((width,))
        cos, sin = rope.rope_frequencies(d, 4096, 1e6)
        pos = torch.randint(0, 4096, (B, T))
        cos, sin = cos[pos].cuda(), sin[pos].cuda()
        xb = _rand((B, T, c))
        _close(rope.QKV_ROPE_SPEC, _plugin("qkv_rope", dict(shape, rows=B * T))(xb, wqkv, bqkv, cos, sin, hq, hkv),
               oracle.qkv_rope(xb, wqkv, bqkv, cos, sin, hq, hkv))
    elif rows > 1:  # attention at a prefill bucket
        T = rows // 2
        q, k, v = _rand((2, hq, T, d)), _rand((2, hkv, T, d)), _rand((2, hkv, T, d))
        sl = torch.tensor([T, T - 37], device="cuda")
        _close(attention.PREFILL_SPEC, _plugin("attention_prefill", shape)(q, k, v, sl, None),
               oracle.attention_prefill(q, k, v, sl.cpu()))
    else:  # attention at a decode bucket
        S = 4096
        qd, kc, vc = _rand((2, hq, d)), _rand((2, hkv, S, d)), _rand((2, hkv, S, d))
        sl = torch.tensor([S, 1001], device="cuda")
        got = _plugin("attention_decode", shape)(qd, kc, vc, sl, None)
        _close(attention.DECODE_SPEC, got, oracle.attention_decode(qd, kc, vc, sl.cpu()))
        torch.testing.assert_close(got, jit["attention_decode"](qd, kc, vc, sl, None), atol=2e-3, rtol=2e-3)


def test_native_cubin_loads_and_foreign_cubin_is_refused():
    from edgekit.kernels.launcher import KernelLoadError, LoadedKernel, device_arch

    here = device_arch()
    v = default_variants("swiglu")["swiglu_fwd"]
    gu = _rand((3, 2 * 1024))  # F a multiple of 16, as the compiled code assumes
    if here in (80, 86, 87, 89, 90):
        plugin = _plugin("swiglu", {}, arch=here, prefer="cubin")
        _close(swiglu.SPEC, plugin(gu), oracle.swiglu(gu))
    other = 87 if here != 87 else 80
    with pytest.raises(KernelLoadError, match=f"cubin for sm_{other} cannot run"):
        LoadedKernel.from_compiled(compile_variant(v, other), prefer="cubin")


def test_unload_then_launch_is_a_clear_error():
    from edgekit.kernels.launcher import KernelLoadError

    plugin = _plugin("swiglu", {})
    gu = _rand((2, 64))
    plugin(gu)
    plugin.unload()
    with pytest.raises(KernelLoadError, match="unloaded"):
        plugin(gu)


def test_plugin_refuses_shapes_it_was_not_built_for():
    from edgekit.kernels.launch_rule import LaunchCheckError

    plugin = _plugin("attention_prefill", dict(head_dim=64, n_heads=9, n_kv_heads=3))
    q = _rand((1, 4, 16, 128))
    with pytest.raises(LaunchCheckError, match="HEAD_DIM 64"):
        plugin(q, q, q, torch.tensor([16], device="cuda"), None)
    x = _rand((2, 100))  # row stride 100: not the multiple of 16 the compiled code assumes
    with pytest.raises(LaunchCheckError, match="multiple of 16"):
        _plugin("rmsnorm", dict(hidden_size=100))(x, _rand((100,)), 1e-5)


def test_loaded_kernels_replay_in_a_cuda_graph_and_swap():
    # Capture with one plugin, swap the dispatch entry for another build, capture again: both replay right.
    from edgekit.kernels.dispatch import DispatchTable

    table = DispatchTable()
    shape = dict(head_dim=128, n_heads=32, n_kv_heads=8, rows=1)
    q, kc, vc = _rand((1, 32, 128)), _rand((1, 8, 2048, 128)), _rand((1, 8, 2048, 128))
    sl = torch.tensor([2048], device="cuda", dtype=torch.int32)
    want = oracle.attention_decode(q, kc, vc, [2048])
    outs = []
    for build in ("ptx", "ptx"):
        table.set("attention_decode", _plugin("attention_decode", shape, prefer=build), source=f"plugin:{len(outs)}")
        table.get("attention_decode")(q, kc, vc, sl, None)  # warm
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = table.get("attention_decode")(q, kc, vc, sl, None)
        graph.replay()
        torch.cuda.synchronize()
        _close(attention.DECODE_SPEC, out, want)
        outs.append((graph, out))
