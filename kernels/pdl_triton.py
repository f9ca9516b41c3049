"""Programmatic dependent launch (PDL, Hopper sm_90+) for the fused decode kernels: device side and launch switch.

A decode step is a chain of small kernels, each waiting for the one before.
Launched with PDL, a kernel's programs may start while the previous kernel is
still draining: they issue what does not depend on it (the weight rows they
will read, prefetched into L2: weights never change between steps), then wait
at ``griddepcontrol.wait`` until the previous kernel has finished and its
writes are visible, then let the next kernel launch
(``griddepcontrol.launch_dependents``). Every kernel of the chain waits before
it reads an activation or writes anything, so the order of the chain is
unchanged, also transitively (a kernel completes only after its own wait).

The switch is a trailing ``PDL: tl.constexpr = 0`` parameter of the kernels
whose ``KernelDef.pdl`` is set:

- 0: no PDL instructions at all. The AOT builds compile this (sm_87 has no
  ``griddepcontrol``; plugins are launched plainly by ``launcher.py``), and so
  does Triton's CPU interpreter.
- 1: wait + launch_dependents only (launch latency overlapped).
- 2: also prefetch the program's first weight tile into L2 before the wait.

``pdl_level(device)`` says which level the JIT launcher uses: 0 below sm_90;
else ``EDGEKIT_PDL`` where set (0, 1 or 2 forces it everywhere); else the
level of the fused decode step being launched (``step_launches``: the step
asks for ``DEFAULT_LEVEL`` when its kernels are short, ``auto_level``), 0
outside one. Triton launches the kernel with the PDL attribute
(``launch_pdl=True``), and CUDA graph capture keeps the programmatic edges
(the graphed step got faster on the H200; greedy tokens equal the
per-operator step's: tests/edgekit/runtime/test_fused_decode_gpu.py).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar

import triton
import triton.language as tl

MIN_ARCH = 90  # griddepcontrol: Hopper and newer
DEFAULT_LEVEL = 2
LEVELS = (0, 1, 2)
ENV = "EDGEKIT_PDL"
L2_LINE_BYTES = 128


@triton.jit
def _prefetch_rows_l2(w_ptr, rows, K, stride_wn, BLOCK_K: tl.constexpr):
    """Ask L2 for W[rows, :BLOCK_K] (one prefetch per 128-byte line; columns past K clamp to column 0)."""
    LINE: tl.constexpr = 128 // (w_ptr.dtype.element_ty.primitive_bitwidth // 8)  # elements per L2 line
    LINES: tl.constexpr = (BLOCK_K + LINE - 1) // LINE  # powers of two: at least 1
    k = tl.arange(0, LINES) * LINE
    k = tl.where(k < K, k, 0)
    ptrs = w_ptr + rows.to(tl.int64)[:, None] * stride_wn + k[None, :]
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // dummy $0", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _pdl_enter(PDL: tl.constexpr):
    """Wait for the previous kernel of the stream (its writes visible), then let the next one launch. PDL 0: nothing."""
    if PDL > 0:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _pdl_enter_after_weights(w_ptr, rows, K, stride_wn, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """``_pdl_enter`` for a GEMV program: at level 2 its weight rows' first K tile is requested first (no wait)."""
    if PDL > 1:
        _prefetch_rows_l2(w_ptr, rows, K, stride_wn, BLOCK_K)
    _pdl_enter(PDL)


# The fused step turns PDL on when its kernels are short (launch-bound decode). Measured on the H200 (batch 1,
# depth 512, random weights, one call, 2026-12-01): smollm2-135m (mean 1.4 MB fp16 / 0.7 MB int8 of weights per
# layer kernel) fp16 1772 -> 2274 tok/s, int8 1756 -> 1997; llama-3.2-1b (24 MB / 12 MB) fp16 1105 -> 1061, int8
# 1434 -> 1294 (level 1 lost as well). The bound sits between them: ~1 us of HBM time at the H200's ~4.2 TB/s, the
# size of the ~1.3 us kernel boundary PDL hides (notes/gpu-apis.md). Sizes between 1.4 and 12 MB were not measured.
# Again with the staged K loops (KernelDef.loop_stages; H200, 2026-12-02, llama-3.2-1b, levels 0 -> 2): fp16 1146 ->
# 1037, int8 1480 -> 1368, int4 1642 -> 1658 (within run-to-run noise): the rule stands.
AUTO_MAX_WEIGHT_BYTES_PER_KERNEL = 4 * 1024 * 1024

_ARCH_BY_DEVICE: dict[int, int] = {}
_STEP_LEVEL: ContextVar[int] = ContextVar("edgekit_pdl_step_level", default=0)


def requested_level() -> int | None:
    """The level forced by ``EDGEKIT_PDL`` (None when unset: each decode step decides); a clear error for a bad one."""
    from edgekit.errors import OperatorError

    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    if raw not in {str(v) for v in LEVELS}:
        raise OperatorError(f"{ENV}={raw!r}; expected one of {', '.join(map(str, LEVELS))} "
                            "(0 off, 1 overlap launches, 2 also prefetch weights)",
                            hint=f"unset {ENV} to let the decode step decide")
    return int(raw)


def auto_level(weight_bytes_per_kernel: float) -> int:
    """The level a decode step whose GEMV kernels read this many weight bytes each (mean) asks for."""
    return DEFAULT_LEVEL if weight_bytes_per_kernel <= AUTO_MAX_WEIGHT_BYTES_PER_KERNEL else 0


def level_for(arch: int, forced: int | None, step: int) -> int:
    """The level of one launch on an sm_<arch> GPU: 0 below sm_90 whatever was asked, else the forced level
    (EDGEKIT_PDL), else the level of the decode step being launched (0 outside one)."""
    if arch < MIN_ARCH:
        return 0
    return step if forced is None else forced


@contextmanager
def step_launches(level: int):
    """Launches made inside use PDL ``level`` (unless EDGEKIT_PDL forces one): a decode step's choice."""
    token = _STEP_LEVEL.set(level)
    try:
        yield
    finally:
        _STEP_LEVEL.reset(token)


def jit_launch_options(device) -> dict:
    """Keyword arguments for a Triton JIT launch of a kernel with the PDL switch on ``device`` now ({}: plain)."""
    level = pdl_level(device)
    return {"PDL": level, "launch_pdl": True} if level else {}


def pdl_level(device) -> int:
    """The level the JIT launcher uses for a launch on ``device`` (a torch device) now: 0 for the CPU interpreter."""
    import torch

    if device is None or device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _ARCH_BY_DEVICE:
        major, minor = torch.cuda.get_device_capability(index)
        _ARCH_BY_DEVICE[index] = 10 * major + minor
    return level_for(_ARCH_BY_DEVICE[index], requested_level(), _STEP_LEVEL.get())
