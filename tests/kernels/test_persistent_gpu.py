"""On the GPU: the persistent decode kernel (one launch a layer, all programs resident, grid barriers) equals its
staged launches to within two FP16 units in the last place (persistent_cases.MAX_ULPS says why not bit for bit; its
scratch buffers start as NaN, so a stage that reads before a barrier fails this), matches the FP64 oracle, and stays
within the FP16 tolerance of the fused super-operators (their kernels run other num_warps, so other reduction
trees), on random shapes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
from persistent_cases import (  # noqa: E402
    launch_differences, layer_ratio, random_layer, run_fused_operators, run_persistent, staged_reference,
)

import fp64_oracle as oracle  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ops():
    from edgekit.kernels.triton_backend import triton_ops

    return triton_ops()


def test_the_barrier_counter_is_left_at_zero_and_reused():
    """Many launches in a row on one counter (as a decode step replays them): each equals the staged result."""
    c = random_layer(B=1, C=576, F=1536, n_heads=9, n_kv_heads=3, head_dim=64, S=700, int8=False, bias=False, seed=1,
                     device="cuda")
    from edgekit.kernels.persistent_decode_triton import new_sync

    sync = new_sync("cuda")
    want, mags = staged_reference(c)
    for _ in range(50):
        got, _, _ = run_persistent(c, staged=False, sync=sync)
        assert not launch_differences({"y": got}, want, mags)
    assert sync.tolist() == [0, 0]


@settings(max_examples=4, deadline=None)  # each new shape compiles six kernel variants
@given(B=st.integers(1, 3), C=st.sampled_from([64, 576, 2048]), int8=st.booleans(), bias=st.booleans(),
       heads=st.sampled_from([(4, 2, 32), (9, 3, 64), (32, 8, 64)]), S=st.sampled_from([40, 700, 3000]),
       seed=st.integers(0, 2**16))
def test_persistent_layer_equals_staged_and_fused(ops, B, C, int8, bias, heads, S, seed):
    hq, hkv, d = heads
    c = random_layer(B=B, C=C, F=3 * C // 2 + 8, n_heads=hq, n_kv_heads=hkv, head_dim=d, S=S, int8=int8, bias=bias,
                     seed=seed, device="cuda")
    y, kc, vc = run_persistent(c, staged=False)
    want, mags = staged_reference(c)
    y_f, _, _ = run_fused_operators(c, ops)
    ratio = layer_ratio(c, y, kc)  # computed first: a mismatch below then says how far the launch is off
    differ = launch_differences({"y": y, "k_cache": kc, "v_cache": vc}, want, mags)
    assert not differ, f"one launch differs from the staged launches (FP16 ULPs: {differ}; FP64 ratio {ratio:.3g})"
    assert ratio <= 1.0
    assert oracle.within(y, oracle.f64(y_f), 1e-2, 1e-2)[0]  # the fused path's layer, up to FP16 rounding
