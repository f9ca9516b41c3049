"""Programmatic dependent launch (PDL, sm_90+): the host side, which launches use it and at what level.

Split from kernels/pdl_triton.py (the device side: the ``griddepcontrol`` helpers the kernels call, which need
Triton) so the decode step can choose its level on a device that runs compiled plugins without Triton installed.
kernels/pdl_triton.py describes the levels.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar

MIN_ARCH = 90  # griddepcontrol: Hopper and newer
DEFAULT_LEVEL = 2
LEVELS = (0, 1, 2)
ENV = "EDGEKIT_PDL"


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
