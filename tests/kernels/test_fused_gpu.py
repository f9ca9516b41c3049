"""On the GPU: every fused decode operator matches the FP64 oracle on random shapes (hypothesis), through the
Triton kernels the runtime's fused decode path launches, for float and INT8 (W8A16) weights, and every one (the
LM head's included) for INT4 (W4A16) weights (group 32/64/128, symmetric or with offsets, FP16 or FP32 scales),
launched with and without programmatic dependent launch (kernels/pdl_triton.py: on sm_90+ the fused step of a small
model uses it), and the INT4 operators with FP16 activations up to 8000 in magnitude (the half2 decode's range, its
inline PTX)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
from fused_cases import FAMILY_FUSED_OPS, FAMILY_INT4_OPS, FUSED_OPS, INT4_OPS, check_case  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ops():
    from edgekit.kernels.triton_backend import triton_ops

    return triton_ops()


@pytest.mark.parametrize("op", FUSED_OPS)
@settings(max_examples=12, deadline=None)
@given(B=st.integers(1, 3), C=st.sampled_from([64, 96, 576, 1000, 2048]), int8=st.booleans(), bias=st.booleans(),
       heads=st.sampled_from([(4, 2, 32), (9, 3, 64), (8, 2, 128), (32, 8, 64)]), S=st.sampled_from([40, 700, 3000]),
       seed=st.integers(0, 2**16), pdl=st.sampled_from([0, 2]))
def test_fused_operator_matches_fp64(ops, op, B, C, int8, bias, heads, S, seed, pdl):
    from edgekit.kernels.pdl_triton import step_launches

    hq, hkv, d = heads
    with step_launches(pdl):
        ratios = check_case(op, ops[op], B=B, C=C, int8=int8, bias=bias, seed=seed, n_heads=hq, n_kv_heads=hkv,
                            head_dim=d, F=3 * C // 2 + 8, N=C + 16, V=4096 + 33, S=S)
    assert all(r <= 1.0 for r in ratios.values()), ratios


@pytest.mark.parametrize("op", INT4_OPS)
@settings(max_examples=int(os.environ.get("FUSED_INT4_EXAMPLES", "12")), deadline=None)
@given(B=st.integers(1, 3), groups=st.sampled_from([1, 3, 9, 16]), group=st.sampled_from([32, 64, 128]),
       symmetric=st.booleans(), scale_dtype=st.sampled_from(["float16", "float32"]), bias=st.booleans(),
       heads=st.sampled_from([(4, 2, 32), (9, 3, 64), (8, 2, 128), (32, 8, 64)]), S=st.sampled_from([40, 700, 3000]),
       seed=st.integers(0, 2**16), pdl=st.sampled_from([0, 2]))
def test_fused_int4_operator_matches_fp64(ops, op, B, groups, group, symmetric, scale_dtype, bias, heads, S, seed, pdl):
    import torch

    from edgekit.kernels.pdl_triton import step_launches

    hq, hkv, d = heads
    if op == "fused_attn_proj_residual" and (hq * d) % group:
        group = 32  # its K is n_heads * head_dim (a multiple of 32 for every head shape drawn)
    C = group * groups  # K of the other operators: up to 2048, as the float cases
    w4 = {"group": group, "symmetric": symmetric, "scale_dtype": getattr(torch, scale_dtype)}
    with step_launches(pdl):
        ratios = check_case(op, ops[op], B=B, C=C, int8=False, bias=bias, seed=seed, n_heads=hq, n_kv_heads=hkv,
                            head_dim=d, F=3 * C // 2 + 8, N=C + 16, S=S, w4=w4)
    assert all(r <= 1.0 for r in ratios.values()), (w4, ratios)


@pytest.mark.parametrize("op", INT4_OPS)
@settings(max_examples=int(os.environ.get("FUSED_INT4_RANGE_EXAMPLES", "6")), deadline=None)
@given(B=st.integers(1, 3), groups=st.sampled_from([1, 3, 16]), group=st.sampled_from([32, 64, 128]),
       symmetric=st.booleans(), scale_dtype=st.sampled_from(["float16", "float32"]),
       heads=st.sampled_from([(4, 2, 32), (32, 8, 64)]), act_range=st.sampled_from([64.0, 1024.0, 4096.0, 8000.0]),
       seed=st.integers(0, 2**16))
def test_fused_int4_operator_with_large_fp16_activations_matches_fp64(ops, op, B, groups, group, symmetric,
                                                                      scale_dtype, heads, act_range, seed):
    """The half2 decode's range (kernels/int4_half2_triton.py), in its inline PTX: FP16 activations up to 8000, every
    row's first sub-block at one sign against codes 0 (an FP16 lane's largest partial, finite thanks to the 1/16
    prescale), group scales divided by the magnitude so the operator's own tolerance applies."""
    import torch

    hq, hkv, d = heads
    if op == "fused_attn_proj_residual" and (hq * d) % group:
        group = 32
    w4 = {"group": group, "symmetric": symmetric, "scale_dtype": getattr(torch, scale_dtype)}
    ratios = check_case(op, ops[op], B=B, C=group * groups, int8=False, bias=False, seed=seed, n_heads=hq,
                        n_kv_heads=hkv, head_dim=d, F=3 * group * groups // 2 + 8, N=group * groups + 16, S=700,
                        w4=w4, act_range=act_range)
    assert all(r <= 1.0 for r in ratios.values()), (w4, act_range, ratios)


@pytest.mark.parametrize("fmt", ["fp16", "int8", "int4"])
@pytest.mark.parametrize("op", ["fused_norm_qkv_rope", "fused_norm_swiglu", "fused_proj_residual",
                                "fused_norm_qkv_qknorm_rope", "fused_norm_geglu"])
@settings(max_examples=int(os.environ.get("FUSED_STAGED_EXAMPLES", "4")), deadline=None)
@given(B=st.integers(1, 3), C=st.sampled_from([576, 1088, 2048]), block_k=st.sampled_from([128, 256]),
       stages=st.sampled_from([2, 3, 5]), warps=st.sampled_from([2, 4]), bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_staged_tiles_match_fp64(op, fmt, B, C, block_k, stages, warps, bias, seed):
    """The K loop staged through shared memory (KernelDef.loop_stages: cp.async, STAGES - 1 steps ahead) computes what
    the FP64 oracle does, over several K steps and a last partial one (C = 1088 at BLOCK_K 128 or 256), for every
    weight format: the default tiles take it only at 1B-class K (>= 2048 / 4096), so it is drawn here directly."""
    import dataclasses

    import torch

    from edgekit.kernels.triton_backend import TritonOp
    from edgekit.kernels.variants import default_variants

    suffix = {"fp16": "_fp", "int8": "_w8", "int4": "_w4"}[fmt]
    facts = dict(head_dim=64, n_heads=8, n_kv_heads=2, n_out=2 * C, k_in=C)
    base = next(v for k, v in default_variants(op, **facts).items() if k.endswith(suffix))
    rows_key = "PAIRS" if op in ("fused_norm_qkv_rope", "fused_norm_qkv_qknorm_rope") else "BLOCK_N"
    v = dataclasses.replace(base, constexprs={**base.constexprs, rows_key: 4, "BLOCK_K": block_k}, num_warps=warps,
                            num_stages=stages)
    w4 = {"group": 64, "symmetric": False, "scale_dtype": torch.float16} if fmt == "int4" else None
    ratios = check_case(op, TritonOp(op, {v.kernel: v}), B=B, C=C, int8=fmt == "int8", bias=bias, seed=seed,
                        n_heads=8, n_kv_heads=2, head_dim=64, F=3 * C // 2 + 64, N=C + 64, S=300, w4=w4)
    assert all(r <= 1.0 for r in ratios.values()), (v.label(), ratios)


# Qwen3 / Gemma 3 head shapes: (query heads, KV heads, head_dim) of qwen3-0.6b / -1.7b, qwen3-4b, gemma-3-1b, and an
# MHA and a GQA-3 shape (the group the QK-norm kernel's counters gather: 1 to 4 query heads a KV head)
FAMILY_HEADS = [(16, 8, 128), (32, 8, 128), (4, 1, 256), (4, 4, 64), (9, 3, 64)]


@pytest.mark.parametrize("op", FAMILY_FUSED_OPS)
@settings(max_examples=12, deadline=None)
@given(B=st.integers(1, 3), C=st.sampled_from([64, 96, 1024, 1152, 2048]), int8=st.booleans(), bias=st.booleans(),
       heads=st.sampled_from(FAMILY_HEADS), S=st.sampled_from([40, 700, 3000]), seed=st.integers(0, 2**16),
       pdl=st.sampled_from([0, 2]))
# always the float defaults at gemma-3-1b's and qwen3-1.7b's widths (the QK-norm QKV's staged tile, planned or JIT)
@example(B=1, C=1152, int8=False, bias=False, heads=(4, 1, 256), S=700, seed=1, pdl=2)
@example(B=2, C=2048, int8=False, bias=False, heads=(16, 8, 128), S=700, seed=2, pdl=0)
def test_family_fused_operator_matches_fp64(ops, op, B, C, int8, bias, heads, S, seed, pdl):
    """The Qwen3 / Gemma 3 fused operators: float and INT8 weights; the QK-norm QKV writes a ring of S/3 rows at
    position % rows, its per-group counters left at zero; attention + o-projection without the residual."""
    from edgekit.kernels.pdl_triton import step_launches

    hq, hkv, d = heads
    with step_launches(pdl):
        ratios = check_case(op, ops[op], B=B, C=C, int8=int8, bias=bias, seed=seed, n_heads=hq, n_kv_heads=hkv,
                            head_dim=d, F=3 * C // 2 + 8, N=C + 16, S=S)
    assert all(r <= 1.0 for r in ratios.values()), ratios


@pytest.mark.parametrize("op", FAMILY_INT4_OPS)
@settings(max_examples=int(os.environ.get("FUSED_INT4_EXAMPLES", "12")), deadline=None)
@given(B=st.integers(1, 3), groups=st.sampled_from([1, 3, 9, 16]), group=st.sampled_from([32, 64, 128]),
       symmetric=st.booleans(), scale_dtype=st.sampled_from(["float16", "float32"]), bias=st.booleans(),
       heads=st.sampled_from(FAMILY_HEADS), S=st.sampled_from([40, 700, 3000]), seed=st.integers(0, 2**16),
       pdl=st.sampled_from([0, 2]), act_range=st.sampled_from([None, 8000.0]))
def test_family_fused_int4_operator_matches_fp64(ops, op, B, groups, group, symmetric, scale_dtype, bias, heads, S,
                                                  seed, pdl, act_range):
    """INT4 (W4A16) weights, also with FP16 activations up to 8000 (the half2 decode's range, its inline PTX)."""
    import torch

    from edgekit.kernels.pdl_triton import step_launches

    hq, hkv, d = heads
    if op == "fused_attn_proj" and (hq * d) % group:
        group = 32
    w4 = {"group": group, "symmetric": symmetric, "scale_dtype": getattr(torch, scale_dtype)}
    with step_launches(pdl):
        ratios = check_case(op, ops[op], B=B, C=group * groups, int8=False, bias=bias and act_range is None,
                            seed=seed, n_heads=hq, n_kv_heads=hkv, head_dim=d, F=3 * group * groups // 2 + 8,
                            N=group * groups + 16, S=S, w4=w4, act_range=act_range)
    assert all(r <= 1.0 for r in ratios.values()), (w4, act_range, ratios)
