"""Host-side checks shared by the Triton wrappers: every refusal is a clear OperatorError."""

from __future__ import annotations

import os

import torch

from edgekit.errors import OperatorError
from edgekit.kernels.kernel_def import TORCH_DTYPE_TO_ACT


def act_dtype(op: str, t: torch.Tensor, name: str) -> str:
    """The kernel dtype name of an activation tensor; FP64 and integer activations are refused."""
    d = TORCH_DTYPE_TO_ACT.get(str(t.dtype))
    if d is None:
        raise OperatorError(
            f"{op}: {name} has dtype {t.dtype}; the Triton kernels take float16, bfloat16 or float32",
            hint="use the reference dispatch table (DispatchTable()) for float64 runs",
        )
    return d


def same_dtype(op: str, t: torch.Tensor, name: str, like: torch.Tensor, like_name: str) -> None:
    if t.dtype != like.dtype:
        raise OperatorError(f"{op}: {name} has dtype {t.dtype} but {like_name} has {like.dtype}; they must match")


def dtype_is(op: str, t: torch.Tensor, name: str, dtype: torch.dtype) -> None:
    if t.dtype != dtype:
        raise OperatorError(f"{op}: {name} has dtype {t.dtype}; expected {dtype}")


def interpreting() -> bool:
    """True under Triton's CPU interpreter (TRITON_INTERPRET=1), where kernels take CPU tensors."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def on_cuda(op: str, *tensors: tuple[str, torch.Tensor | None]) -> None:
    devices = {t.device for _, t in tensors if t is not None}
    # "meta" tensors are shape-only stand-ins: launch_count resolves programs on them and never launches
    allowed = ("cuda", "cpu", "meta") if interpreting() else ("cuda", "meta")
    for name, t in tensors:
        if t is not None and t.device.type not in allowed:
            raise OperatorError(f"{op}: {name} is on {t.device}; the Triton kernels run on a CUDA device",
                                hint="move the model with .to('cuda') or use the reference dispatch table")
    if len(devices) > 1:
        raise OperatorError(f"{op}: tensors are on different devices {sorted(map(str, devices))}")


def ndim(op: str, t: torch.Tensor, name: str, n: int, layout: str) -> None:
    if t.dim() != n:
        raise OperatorError(f"{op}: {name} has shape {tuple(t.shape)}; expected {n} dimensions {layout}")


def unit_last_stride(op: str, t: torch.Tensor, name: str) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise OperatorError(
            f"{op}: {name} has stride {t.stride()} (last axis stride {t.stride(-1)}); the kernel reads the last "
            "axis contiguously", hint="pass a tensor with a contiguous last axis (e.g. .contiguous())")


def rows(op: str, t: torch.Tensor, name: str) -> torch.Tensor:
    """View (..., C) as (M, C) without copying; refuse layouts that need a copy."""
    unit_last_stride(op, t, name)
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError as e:
        raise OperatorError(
            f"{op}: {name} with shape {tuple(t.shape)} and strides {t.stride()} cannot be viewed as rows",
            hint="pass a tensor whose leading axes are contiguous (e.g. .contiguous())") from e


def vector(op: str, t: torch.Tensor | None, name: str, n: int) -> None:
    if t is not None and (t.dim() != 1 or t.shape[0] != n or (n > 1 and t.stride(0) != 1)):
        raise OperatorError(f"{op}: {name} has shape {tuple(t.shape)} strides {t.stride()}; expected a contiguous ({n},)")


def head_dim_ok(op: str, d: int) -> None:
    if d < 16 or d & (d - 1):
        raise OperatorError(f"{op}: head_dim {d} is not supported by the Triton kernels; expected a power of two >= 16",
                            hint="use the reference dispatch table for this model")


def seq_lens_i32(op: str, seq_lens: torch.Tensor, batch: int) -> torch.Tensor:
    if seq_lens.dim() != 1 or seq_lens.shape[0] != batch:
        raise OperatorError(f"{op}: seq_lens has shape {tuple(seq_lens.shape)}; expected ({batch},)")
    if seq_lens.dtype not in (torch.int32, torch.int64):
        raise OperatorError(f"{op}: seq_lens has dtype {seq_lens.dtype}; expected int32 or int64")
    # int64 lengths (torch's default) are narrowed for the kernel; contiguous so the kernel can index by b.
    return seq_lens.to(torch.int32).contiguous()
