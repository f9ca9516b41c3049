"""GPU: every Triton kernel (JIT, through its launch program) matches the FP64 oracle within its spec tolerance.

Shapes are drawn by hypothesis: odd lengths, lengths that are not multiples of
any tile, GQA ratios 1/3/4/8, head dims 64/128, GEMV (decode) and GEMM
(prefill) row counts. Tolerances are the OpSpec's per-dtype ones (kernels/spec.py).
Run on the GPU machine: python -m pytest -q -m gpu tests/kernels
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgekit.errors import OperatorError
from edgekit.kernels import attention, geglu, linear, qk_norm_rope, rmsnorm, rope, swiglu

sys.path.insert(0, str(Path(__file__).parent))
import fp64_oracle as oracle  # noqa: E402

pytestmark = pytest.mark.gpu
SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
dts = st.sampled_from(["float16", "bfloat16", "float32"])
gqa = st.sampled_from([1, 3, 4, 8])
head_dims = st.sampled_from([64, 128])


@pytest.fixture(scope="module")
def ops():
    from edgekit.kernels.triton_backend import triton_ops

    return triton_ops()


def _close(spec, dt, got, want):
    tol = spec.tolerance_for(dt)
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
    for g, w in zip(got, want):
        assert torch.isfinite(g.float()).all(), f"{spec.name}: non-finite output"
        ok, ratio = oracle.within(g, w, tol.atol, tol.rtol)
        assert ok, f"{spec.name} {dt}: error is {ratio:.2f}x the allowed {tol}"


def _rand(g, shape, dt, scale=1.0):
    return (torch.randn(shape, generator=g, device="cuda", dtype=torch.float32) * scale).to(DT[dt])


def _gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


@SETTINGS
@given(rows=st.integers(1, 70), cols=st.integers(1, 5000), dt=dts, seed=st.integers(0, 9999))
def test_rmsnorm(ops, rows, cols, dt, seed):
    g = _gen(seed)
    x, w = _rand(g, (rows, cols), dt), _rand(g, (cols,), dt)
    _close(rmsnorm.SPEC, dt, ops["rmsnorm"](x, w, 1e-6), oracle.rmsnorm(x, w, 1e-6))


@SETTINGS
@given(rows=st.integers(1, 70), f=st.integers(1, 5000), dt=dts, seed=st.integers(0, 9999))
def test_swiglu(ops, rows, f, dt, seed):
    g = _gen(seed)
    gu = _rand(g, (rows, 2 * f), dt, 2.0)
    _close(swiglu.SPEC, dt, ops["swiglu"](gu), oracle.swiglu(gu))


rows_st = st.one_of(st.integers(1, 8), st.integers(9, 300))  # GEMV and GEMM paths


@SETTINGS
@given(m=rows_st, n=st.integers(1, 700), k=st.integers(1, 2100), bias=st.booleans(), dt=dts, seed=st.integers(0, 9999))
def test_linear_fp(ops, m, n, k, bias, dt, seed):
    g = _gen(seed)
    x, w = _rand(g, (m, k), dt), _rand(g, (n, k), dt, k**-0.5)
    b = _rand(g, (n,), dt) if bias else None
    _close(linear.LINEAR_SPEC, dt, ops["linear"](x, w, b), oracle.linear(x, w, b))


@SETTINGS
@given(m=rows_st, n=st.integers(1, 700), k=st.integers(1, 2100), bias=st.booleans(), dt=dts, seed=st.integers(0, 9999))
def test_linear_w8a16(ops, m, n, k, bias, dt, seed):
    g = _gen(seed)
    x = _rand(g, (m, k), dt)
    q = torch.randint(-128, 128, (n, k), generator=g, device="cuda", dtype=torch.int8)  # -128 too: the full range
    s = torch.rand(n, generator=g, device="cuda") / (100 * k**0.5)
    b = _rand(g, (n,), dt) if bias else None
    _close(linear.W8A16_SPEC, dt, ops["linear_w8a16"](x, q, s, b), oracle.linear_w8a16(x, q, s, b))


@SETTINGS
@given(m=rows_st, n=st.integers(1, 700), k=st.integers(1, 2100), bias=st.booleans(), smooth=st.booleans(),
       dt=st.sampled_from(["float16", "bfloat16"]), seed=st.integers(0, 9999))
def test_linear_w8a8(ops, m, n, k, bias, smooth, dt, seed):
    g = _gen(seed)
    x = _rand(g, (m, k), dt)
    q = torch.randint(-127, 128, (n, k), generator=g, device="cuda", dtype=torch.int8)
    s = torch.rand(n, generator=g, device="cuda") / (100 * k**0.5)
    b = _rand(g, (n,), dt) if bias else None
    sm = torch.rand(k, generator=g, device="cuda") + 0.5 if smooth else None
    # Held to the reference in its own FP32 arithmetic (a .5 tie may round differently in FP64).
    want = linear.linear_w8a8_reference(x.float(), q, s, None if b is None else b.float(), sm)
    _close(linear.W8A8_SPEC, dt, ops["linear_w8a8"](x, q, s, b, sm), want)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 2), hkv=st.integers(1, 3), ratio=gqa, d=head_dims, t=st.integers(1, 300), dt=dts, data=st.data())
def test_attention_prefill(ops, b, hkv, ratio, d, t, dt, data):
    g = _gen(data.draw(st.integers(0, 9999)))
    q, k, v = (_rand(g, (b, h, t, d), dt) for h in (hkv * ratio, hkv, hkv))
    seq_lens = torch.tensor([data.draw(st.integers(1, t)) for _ in range(b)], device="cuda")
    _close(attention.PREFILL_SPEC, dt, ops["attention_prefill"](q, k, v, seq_lens, None),
           oracle.attention_prefill(q, k, v, seq_lens.cpu()))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 2), hkv=st.integers(1, 2), ratio=st.sampled_from([1, 4, 8]), d=st.sampled_from([128, 256]),
       t=st.integers(1, 1100), dt=dts, data=st.data())
def test_attention_prefill_with_a_sliding_window(ops, b, hkv, ratio, d, t, dt, data):
    g = _gen(data.draw(st.integers(0, 9999)))
    q, k, v = (_rand(g, (b, h, t, d), dt) for h in (hkv * ratio, hkv, hkv))
    seq_lens = torch.tensor([data.draw(st.integers(1, t)) for _ in range(b)], device="cuda")
    window = data.draw(st.sampled_from([1, 17, 512, max(1, t // 3)]))  # 512: Gemma 3's
    _close(attention.PREFILL_SPEC, dt, ops["attention_prefill"](q, k, v, seq_lens, None, window),
           oracle.attention_prefill(q, k, v, seq_lens.cpu(), None, window))


@SETTINGS
@given(b=st.integers(1, 2), t=st.integers(1, 40), hkv=st.integers(1, 8), ratio=st.sampled_from([1, 2, 4]),
       d=st.sampled_from([128, 256]), dt=dts, seed=st.integers(0, 9999))
def test_qk_norm_rope(ops, b, t, hkv, ratio, d, dt, seed):
    g = _gen(seed)
    hq = hkv * ratio
    qkv = _rand(g, (b, t, (hq + 2 * hkv) * d), dt, 3.0)
    qn, kn = (1 + 0.3 * _rand(g, (d,), "float32")).to(DT[dt]), (1 + 0.3 * _rand(g, (d,), "float32")).to(DT[dt])
    cos, sin = rope.rope_frequencies(d, t, 1e6)
    cos, sin = cos[None].expand(b, t, -1).cuda(), sin[None].expand(b, t, -1).cuda()
    _close(qk_norm_rope.SPEC, dt, ops["qk_norm_rope"](qkv, qn, kn, cos, sin, hq, hkv, 1e-6),
           oracle.qk_norm_rope(qkv, qn, kn, cos, sin, hq, hkv, 1e-6))


@SETTINGS
@given(rows=st.integers(1, 70), f=st.integers(1, 7000), dt=dts, seed=st.integers(0, 9999))
def test_geglu(ops, rows, f, dt, seed):
    gu = _rand(_gen(seed), (rows, 2 * f), dt, 3.0)
    _close(geglu.SPEC, dt, ops["geglu"](gu), oracle.geglu(gu))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 3), hkv=st.integers(1, 3), ratio=gqa, d=head_dims, s=st.integers(1, 5000), dt=dts, data=st.data())
def test_attention_decode(ops, b, hkv, ratio, d, s, dt, data):
    g = _gen(data.draw(st.integers(0, 9999)))
    q = _rand(g, (b, hkv * ratio, d), dt)
    kc, vc = _rand(g, (b, hkv, s, d), dt), _rand(g, (b, hkv, s, d), dt)
    seq_lens = torch.tensor([data.draw(st.integers(1, s)) for _ in range(b)], device="cuda")
    _close(attention.DECODE_SPEC, dt, ops["attention_decode"](q, kc, vc, seq_lens, None),
           oracle.attention_decode(q, kc, vc, seq_lens.cpu()))


@pytest.mark.parametrize("d, room_for", [(128, 128), (256, 64)])
def test_decode_attention_takes_the_key_block_this_gpus_shared_memory_holds(d, room_for):
    """The JIT path tells the defaults what this GPU lets a block opt in to (kernels/triton_backend.py): an sm_90
    (227 KB) stages 128-key blocks at head_dim 128 and 64-key blocks at 256 (139,264 / 143,360 B); an older GPU or
    one without the room takes the orin-sized 64 / 32. What it computes matches FP64 at several splits."""
    from edgekit.kernels.attention_triton import _decode_smem
    from edgekit.kernels.triton_backend import TritonOp, gpu_tile_facts

    room = gpu_tile_facts(torch.device("cuda")).get("shared_bytes_per_block", 0)  # sm_90+ only
    staged = _decode_smem({"HEAD_DIM": d, "BLOCK_N": room_for, "BLOCK_G": 16}, 4, 3, 2)
    want = room_for if room >= staged else room_for // 2
    g = _gen(d)
    q = _rand(g, (2, 4, d), "float16")
    kc, vc = _rand(g, (2, 2, 1500, d), "float16"), _rand(g, (2, 2, 1500, d), "float16")
    seq_lens = torch.tensor([1500, 777], device="cuda")
    op = TritonOp("attention_decode")
    got = op(q, kc, vc, seq_lens, None)
    assert f"BLOCK_N={want}," in op.variants_used()["attention_decode_split"], (room, op.variants_used())
    _close(attention.DECODE_SPEC, "float16", got, oracle.attention_decode(q, kc, vc, seq_lens.cpu()))


@SETTINGS
@given(b=st.integers(1, 2), t=st.integers(1, 40), hkv=st.integers(1, 2), ratio=gqa, d=head_dims, c=st.integers(16, 700),
       bias=st.booleans(), dt=dts, seed=st.integers(0, 9999))
def test_qkv_rope_and_rope(ops, b, t, hkv, ratio, d, c, bias, dt, seed):
    g = _gen(seed)
    hq = hkv * ratio
    width = (hq + 2 * hkv) * d
    cos, sin = rope.rope_frequencies(d, 64, 10000.0)
    pos = torch.randint(0, 64, (b, t), generator=torch.Generator().manual_seed(seed))
    cos, sin = cos[pos].cuda(), sin[pos].cuda()  # (B, T, D/2)
    x, w = _rand(g, (b, t, c), dt), _rand(g, (width, c), dt, c**-0.5)
    bq = _rand(g, (width,), dt) if bias else None
    _close(rope.QKV_ROPE_SPEC, dt, ops["qkv_rope"](x, w, bq, cos, sin, hq, hkv), oracle.qkv_rope(x, w, bq, cos, sin, hq, hkv))
    qkv = _rand(g, (b, t, width), dt)
    _close(rope.ROPE_SPEC, dt, ops["rope"](qkv, cos, sin, hq, hkv), oracle.rope(qkv, cos, sin, hq, hkv))


def test_wrapper_errors_are_clear(ops):
    x = torch.randn(4, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(OperatorError, match="weight has dtype torch.float32 but x has torch.float16"):
        ops["rmsnorm"](x, torch.ones(64, device="cuda"), 1e-5)
    with pytest.raises(OperatorError, match="contiguous last axis"):
        ops["swiglu"](torch.randn(64, 4, device="cuda", dtype=torch.float16).T)
    with pytest.raises(OperatorError, match="float64"):
        ops["linear"](x.double(), torch.randn(8, 64, device="cuda", dtype=torch.float64))
    with pytest.raises(OperatorError, match="CUDA device"):
        ops["rmsnorm"](x.cpu(), torch.ones(64, dtype=torch.float16), 1e-5)
    q = torch.randn(1, 6, 16, 96, device="cuda", dtype=torch.float16)
    with pytest.raises(OperatorError, match="head_dim 96"):
        ops["attention_prefill"](q, q[:, :2], q[:, :2], torch.tensor([16], device="cuda"), None)


def test_cuda_graph_replay_matches_eager(ops):
    # Static-shape decode attention + GEMV under a CUDA graph: buffers come from the graph pool, launches replay.
    g = _gen(1)
    q, kc, vc = _rand(g, (1, 32, 128), "float16"), _rand(g, (1, 8, 4096, 128), "float16"), _rand(g, (1, 8, 4096, 128), "float16")
    seq_lens = torch.tensor([3000], device="cuda", dtype=torch.int32)
    w = torch.randint(-127, 128, (512, 4096), generator=g, device="cuda", dtype=torch.int8)
    s = torch.rand(512, generator=g, device="cuda") / 1000

    def step():
        o = ops["attention_decode"](q, kc, vc, seq_lens, None)  # (1, 32, 128)
        return ops["linear_w8a16"](o.reshape(1, 4096), w, s)

    eager = step()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up compiles outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    seq_lens.fill_(4096)  # the same graph serves a longer sequence: splits are sized on the device
    graph.replay()
    torch.cuda.synchronize()
    _close(attention.DECODE_SPEC, "float16", out, oracle.linear_w8a16(
        torch.from_numpy(oracle.attention_decode(q, kc, vc, [4096]).reshape(1, 4096)), w, s))
    assert not torch.equal(out, eager)  # it really recomputed with the new length


def test_decoder_on_triton_table_matches_reference_table():
    from edgekit.kernels.dispatch import DispatchTable
    from edgekit.kernels.triton_backend import triton_dispatch_table
    from edgekit.model.loader import load_model

    model = load_model("preset:tiny", tokenizer=False)
    ref = model.decoder(device="cuda", dtype=torch.float16, ops=DispatchTable())
    tri = model.decoder(device="cuda", dtype=torch.float16, ops=triton_dispatch_table())
    from edgekit.kernels.registry import OPERATORS

    # every operator with Triton kernels runs them; the reference-only ones (no Triton kernels yet, e.g. the grouped
    # W8A16 GEMV) stay on their reference, which this decoder (FP16 weights) never calls
    assert {op for op, src in tri.ops.sources().items() if src != "triton"} == \
        {name for name, op in OPERATORS.items() if op.triton is None}
    tokens = torch.randint(0, model.config.vocab_size, (2, 13), device="cuda")
    seq_lens = torch.tensor([13, 9], device="cuda")
    c1, c2 = ref.new_cache(2, 32), tri.new_cache(2, 32)
    l1, l2 = ref.prefill(tokens, seq_lens, c1), tri.prefill(tokens, seq_lens, c2)
    torch.testing.assert_close(l2.float(), l1.float(), atol=3e-2, rtol=3e-2)
    nxt = l1.argmax(-1)
    d1, d2 = ref.decode(nxt, seq_lens, c1), tri.decode(nxt, seq_lens, c2)
    torch.testing.assert_close(d2.float(), d1.float(), atol=3e-2, rtol=3e-2)
