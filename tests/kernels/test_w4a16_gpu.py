"""GPU: the W4A16 GEMV and GEMM (JIT, through the launch program) match the FP64 oracle; the sm_87 PTX of the
default variants JIT-loads on this GPU and gives the same numbers.

Run on the GPU machine: python -m pytest -q -m gpu tests/kernels/test_w4a16_gpu.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
from w4a16_cases import check_case, w4a16_inputs  # noqa: E402

pytestmark = pytest.mark.gpu
OP = "linear_w4a16"


@pytest.fixture(scope="module")
def op():
    from edgekit.kernels.triton_backend import TritonOp

    return TritonOp(OP)


@settings(max_examples=int(os.environ.get("W4A16_EXAMPLES", "20")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(M=st.sampled_from([1, 1, 2, 7, 64, 300]), groups=st.integers(1, 112), group=st.sampled_from([32, 64, 128]),
       N=st.integers(1, 3000), symmetric=st.booleans(), scale_dtype=st.sampled_from([torch.float16, torch.float32]),
       bias=st.booleans(), act=st.sampled_from(["fp16", "bf16", "fp32"]), seed=st.integers(0, 2**16))
def test_w4a16_matches_the_fp64_oracle(op, M, groups, group, N, symmetric, scale_dtype, bias, act, seed):
    ratio = check_case(op, M=M, K=group * groups, N=N, group=group, symmetric=symmetric, scale_dtype=scale_dtype,
                       bias=bias, act=act, seed=seed, device="cuda")
    assert ratio <= 1.0, f"error is {ratio:.2f}x the allowed"


@pytest.mark.parametrize("M", [1, 64])
def test_w4a16_long_k_llama_shape(op, M):
    # llama-3.1-8b's w_down: K = 14336, the longest reduction a decode GEMV runs (split-K on the H200)
    assert check_case(op, M=M, K=14336, N=4096, group=128, symmetric=False, scale_dtype=torch.float16, bias=False,
                      act="fp16", seed=M, device="cuda") <= 1.0


def test_sm87_ptx_runs_here_like_the_jit(op):
    # the Orin plugin's PTX (forward-compatible) loaded with cuda-python, launched through the same program
    from edgekit.kernels.aot import compile_variant
    from edgekit.kernels.launcher import LoadedKernel, PluginOp
    from edgekit.kernels.variants import default_variants, op_program

    for M in (1, 48):
        variants = default_variants(OP, rows=M)
        kernels = {k: LoadedKernel.from_compiled(compile_variant(v, 87, budget_bytes=131072), prefer="ptx")
                   for k, v in variants.items()}
        plugin = PluginOp(OP, op_program(OP, variants, aot=True), kernels)
        args = w4a16_inputs(M=M, K=1536, N=576, group=64, symmetric=False, scale_dtype=torch.float16, bias=True,
                            act="fp16", seed=M, device="cuda")
        # the same PTX path Triton JITs natively for sm_90 may pick other instructions: equal to FP16 rounding
        torch.testing.assert_close(plugin(*args), op(*args), rtol=2e-3, atol=2e-3)


def _half2_op(act: str, block_n: int = 128, block_k: int = 256, warps: int = 2, decode: int = 3, stages: int = 1):
    from edgekit.kernels.triton_backend import TritonOp
    from edgekit.kernels.variants import KernelVariant

    return TritonOp(OP, {"w4a16_gemv": KernelVariant(
        OP, "w4a16_gemv", {"BLOCK_M": 1, "BLOCK_N": block_n, "BLOCK_K": block_k, "DECODE": decode}, warps, stages,
        dtype=act)})


@settings(max_examples=int(os.environ.get("W4A16_EXAMPLES", "20")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups=st.integers(1, 112), group=st.sampled_from([32, 64, 128]), N=st.integers(1, 3000),
       symmetric=st.booleans(), scale_dtype=st.sampled_from([torch.float16, torch.float32]), bias=st.booleans(),
       act=st.sampled_from(["fp16", "fp16", "bf16", "fp32"]),
       tile=st.sampled_from([(128, 256, 2), (64, 256, 2), (256, 256, 4), (64, 512, 4)]), decode=st.sampled_from([3, 4]),
       stages=st.sampled_from([1, 1, 3]), seed=st.integers(0, 2**16))
def test_half2_gemv_matches_the_fp64_oracle(groups, group, N, symmetric, scale_dtype, bias, act, tile, decode, stages,
                                            seed):
    # DECODE 3: the inline-PTX half2 path for FP16 activations (BF16 / FP32 take the FP32 words path); 4: the same
    # with the next K step's words loaded ahead; stages 3: the K loop's words staged through shared memory
    ratio = check_case(_half2_op(act, *tile, decode=decode, stages=stages), M=1, K=group * groups, N=N, group=group,
                       symmetric=symmetric, scale_dtype=scale_dtype, bias=bias, act=act, seed=seed, device="cuda")
    assert ratio <= 1.0, f"error is {ratio:.2f}x the allowed"


def test_half2_gemv_keeps_large_activations_finite():
    # activations of a few thousand (outlier channels): the half2 sums take x / 16 and stay finite
    x, q, s, m, b = w4a16_inputs(M=1, K=4096, N=512, group=128, symmetric=True, scale_dtype=torch.float16, bias=False,
                                 act="fp16", seed=7, device="cuda")
    x = (x.float() * 1000).clamp(-6000, 6000).half()
    y = _half2_op("fp16")(x, q, s, m, b)
    import fp64_oracle as oracle

    want = oracle.linear_w4a16(x, q, s, m, b)
    assert torch.isfinite(y).all()
    assert oracle.within(y, want, 1e-2 * float(abs(want).max()), 1e-2)[0]
