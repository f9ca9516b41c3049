"""Which kernels one operator call launches, read from its launch program without a GPU.

The program is resolved on shape-only "meta" tensors (``host_checks.on_cuda``
lets them through; nothing is ever launched on them), so every ``when`` of the
program (the split-K GEMV's second launch, the decode reduce) is decided the
way the device decides it for the given SM count.
"""

from __future__ import annotations

from typing import Mapping

import torch

from edgekit.kernels.launch_rule import resolve_program
from edgekit.kernels.registry import operator
from edgekit.kernels.variants import op_program

_META_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64,
                "i8": torch.int8, "i32": torch.int32, "i64": torch.int64}


def launched_kernels(op: str, variants: Mapping, args: tuple, device: Mapping[str, int]) -> list[str]:
    """Kernel names, in launch order, of one call of ``op`` with the reference's arguments ``args`` (meta tensors)."""
    tensors, attrs, _ = operator(op).kernels.prepare(*args)
    program = op_program(op, variants, aot=False)  # launches only: the alignment checks of a compiled plugin do not count

    def allocate(name: str, shape: list[int], dtype: str) -> torch.Tensor:
        return torch.empty(shape, dtype=_META_DTYPES[dtype], device="meta")

    _, launches = resolve_program(program, tensors, attrs, device, allocate)
    return [ln.kernel for ln in launches]
