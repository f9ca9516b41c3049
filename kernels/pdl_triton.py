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
- 2: also prefetch the program's first weight tile into L2 before the wait (the
  split-KV attention: its first key / value tile, ``_prefetch_split_kv``).
- 3 (``TRIGGER``): launched plainly, no wait; the next kernel may launch at the
  start (the QKV operators before the attention: pdl_launch.py says why).

``pdl_level(device, op)`` says which level the JIT launcher uses for a kernel
of operator ``op``: 0 below sm_90; else what ``EDGEKIT_PDL`` forces (0, 1 or 2
everywhere, ``attn`` or operators joined by ``+``: level 2 for those only);
else what the fused decode step being launched asks (``step_launches``, a
level or a level per operator: ``DEFAULT_LEVEL`` everywhere when its kernels
are short, level 2 for the attention operators only when they are not,
``auto_level``), 0 outside one. Triton launches the kernel with the PDL attribute
(``launch_pdl=True``), and CUDA graph capture keeps the programmatic edges
(the graphed step got faster on the H200; greedy tokens equal the
per-operator step's: tests/edgekit/runtime/test_fused_decode_gpu.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

# the host side (levels, the auto rule, the launch switch) lives in kernels/pdl_launch.py, importable without Triton;
# re-exported here for the kernels and tools that know it by this module
from edgekit.kernels.pdl_launch import (  # noqa: F401
    _STEP_LEVEL, AFTER_ATTENTION, AFTER_ATTENTION_OPS, AUTO_MAX_WEIGHT_BYTES_PER_KERNEL, DEFAULT_LEVEL, ENV, LEVELS,
    MIN_ARCH, QKV_OPS, TRIGGER, auto_level, jit_launch_options, level_for, pdl_level, requested_level, step_launches,
)

L2_LINE_BYTES = 128
_TRIGGER_LEVEL = tl.constexpr(TRIGGER)  # the host's level number, as the kernels compare it


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
    """Wait for the previous kernel of the stream (its writes visible), then let the next one launch. PDL 0: nothing;
    PDL 3 (TRIGGER: a plain launch, already ordered after the previous kernel): only let the next one launch."""
    if PDL == _TRIGGER_LEVEL:
        tl.extra.cuda.gdc_launch_dependents()
    elif PDL > 0:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _pdl_enter_after_weights(w_ptr, rows, K, stride_wn, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """``_pdl_enter`` for a GEMV program: at level 2 its weight rows' first K tile is requested first (no wait)."""
    if PDL == 2:
        _prefetch_rows_l2(w_ptr, rows, K, stride_wn, BLOCK_K)
    _pdl_enter(PDL)
