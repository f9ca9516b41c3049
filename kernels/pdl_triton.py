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

``pdl_level(device)`` says which level the JIT launcher uses: 0 off sm_90+,
else ``EDGEKIT_PDL`` (default ``DEFAULT_LEVEL``). Triton launches the kernel
with the PDL attribute (``launch_pdl=True``); CUDA graph capture keeps the
programmatic edges (measured: scripts/bench_decode_vs_llamacpp.py with
EDGEKIT_PDL=0 against the default, same run).
"""

from __future__ import annotations

import os

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


_LEVEL_BY_DEVICE: dict[int, int] = {}


def requested_level() -> int:
    """The level asked for in ``EDGEKIT_PDL`` (default ``DEFAULT_LEVEL``); a clear error for anything else."""
    from edgekit.errors import OperatorError

    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT_LEVEL
    if raw not in {str(v) for v in LEVELS}:
        raise OperatorError(f"{ENV}={raw!r}; expected one of {', '.join(map(str, LEVELS))} "
                            "(0 off, 1 overlap launches, 2 also prefetch weights)",
                            hint=f"unset {ENV} for the default ({DEFAULT_LEVEL})")
    return int(raw)


def level_for_arch(arch: int, requested: int) -> int:
    """The PDL level a kernel launch on an sm_<arch> GPU uses: 0 below sm_90 whatever was asked."""
    return requested if arch >= MIN_ARCH else 0


def pdl_level(device) -> int:
    """The level the JIT launcher uses on ``device`` (a torch device): 0 for the CPU interpreter and pre-Hopper GPUs.

    Read once per device (a captured CUDA graph keeps the launches it was captured with)."""
    import torch

    if device is None or device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _LEVEL_BY_DEVICE:
        major, minor = torch.cuda.get_device_capability(index)
        _LEVEL_BY_DEVICE[index] = level_for_arch(10 * major + minor, requested_level())
    return _LEVEL_BY_DEVICE[index]
