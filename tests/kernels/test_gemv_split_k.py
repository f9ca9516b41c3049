"""The linear ops' GEMV launch rule: split-K only where the (N, M) tiles cannot fill the device.

The numbers of the split path (partials, then the same kernel summing them) are checked against the FP64
oracle under the interpreter (interpret_check.py) and on the GPU (test_triton_gpu.py).
"""

from __future__ import annotations

import pytest
import torch

from edgekit.kernels import linear_triton
from edgekit.kernels.launch_rule import resolve_program
from edgekit.kernels.variants import KernelVariant, default_variants, op_program

SMS = 132


def _launches(M: int, N: int, K: int, variants=None, op="linear_w8a16"):
    variants = variants or default_variants(op, rows=M)
    program = op_program(op, variants)
    x = torch.zeros(M, K, dtype=torch.float16)
    w = torch.zeros(N, K, dtype=torch.int8 if op == "linear_w8a16" else torch.float16)
    tensors = {"x": x, "weight": w, "scale": torch.zeros(N), "bias": None}
    bufs, launches = resolve_program(program, tensors, {}, {"sm_count": SMS, "max_shared_bytes": 232448},
                                     lambda name, shape, dt: torch.empty(shape, dtype=torch.float32))
    return bufs, launches


def _gemv(v: dict) -> KernelVariant:
    return KernelVariant("linear_w8a16", "w8a16_gemv", {"BLOCK_M": 1, "W_INT8": 1, **v}, 4, 1)


@pytest.mark.parametrize("N, K, splits", [
    (28672, 4096, 1),   # 1792 tiles of 16 rows already fill 4 programs x 132 SMs
    (1536, 8960, 6),    # 96 tiles -> cdiv(528, 96) = 6 splits (K allows cdiv(8960, 4 x 256) = 9)
    (4096, 14336, 3),   # 256 tiles -> 3 splits
    (576, 2048, 2),     # 36 tiles would want 15, but splits keep >= 4 K blocks of 256
    (576, 576, 1),      # too little K to pay for a second launch
])
def test_split_count_follows_tiles_and_k_blocks(N, K, splits):
    bufs, launches = _launches(1, N, K, {"w8a16_gemv": _gemv({"BLOCK_N": 16, "BLOCK_K": 256})})
    main = launches[0]
    assert main.kernel == "w8a16_gemv" and main.grid == (-(-N // 16), 1, splits)
    assert main.args[-2:] == [splits, 0]  # num_splits, reduce_splits
    if splits == 1:
        assert len(launches) == 1 and bufs["part"].numel() == 0
    else:
        (red,) = launches[1:]
        assert red.kernel == "w8a16_gemv" and red.grid == (-(-N // 16), 1, 1) and red.args[-2:] == [splits, 1]
        assert tuple(bufs["part"].shape) == (splits, 1, N)
        assert red.args[5].tensor is bufs["part"] and main.args[5].tensor is bufs["part"]


def test_gemm_rows_never_split_nor_allocate_partials():
    bufs, launches = _launches(37, 1536, 8960)
    assert [ln.kernel for ln in launches] == ["w8a16_gemm"]
    assert bufs["part"].numel() == 0


def test_one_row_takes_the_gemv_with_split_k_and_two_rows_the_gemm():
    bufs, launches = _launches(1, 1536, 8960)
    assert [ln.kernel for ln in launches] == ["w8a16_gemv", "w8a16_gemv"]
    assert launches[0].grid[2] > 1 and tuple(bufs["part"].shape[1:]) == (1, 1536)
    _, launches = _launches(2, 1536, 8960)
    assert [ln.kernel for ln in launches] == ["w8a16_gemm"]


def test_a_gemv_only_program_runs_each_row_as_its_own_programs():
    bufs, launches = _launches(3, 1536, 8960, {"w8a16_gemv": _gemv({"BLOCK_N": 16, "BLOCK_K": 256})})
    assert launches[0].grid == (96, 3, 2)  # cdiv(528, 96 x 3) = 2 splits
    assert tuple(bufs["part"].shape) == (2, 3, 1536)


def test_programs_per_sm_sets_the_target(monkeypatch):
    monkeypatch.setattr(linear_triton, "GEMV_PROGRAMS_PER_SM", 1)
    _, launches = _launches(1, 1536, 8960, {"w8a16_gemv": _gemv({"BLOCK_N": 16, "BLOCK_K": 256})})
    assert launches[0].grid[2] == 2  # cdiv(132, 96)


def test_fp16_linear_uses_the_same_rule():
    _, launches = _launches(1, 1536, 8960, op="linear")
    assert [ln.kernel for ln in launches] == ["linear_gemv", "linear_gemv"]
