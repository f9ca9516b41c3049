"""Programmatic dependent launch (PDL, sm_90+): the host side, which launches use it and at what level.

Split from kernels/pdl_triton.py (the device side: the ``griddepcontrol`` helpers the kernels call, which need
Triton) so the decode step can choose its level on a device that runs compiled plugins without Triton installed.
kernels/pdl_triton.py describes the levels.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from functools import lru_cache
from contextvars import ContextVar

from edgekit.kernels.arch import arch_of_capability

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

# A step's ask is a level for every PDL kernel it launches, or a level per operator (the others plain). Selective:
# only the attention operators' launches (the split-KV attention, then the projection GEMV after it) use PDL, so
# the projection's programs start beside the attention, whose short, latency-bound kernel leaves most SMs and most
# of the bandwidth idle, and fetch their weight rows into L2 before they wait for it; every other kernel launches
# plainly, so no program waits early in an SM that a bandwidth-bound GEMV could use (why level 2 everywhere lost
# at 1B). The projection's prefetch is its first BLOCK_K tile: the whole row at the default tiles up to K = 2048.
#
# Level TRIGGER (3, never forced by EDGEKIT_PDL's numbers) is for the QKV operators before the attention: launched
# plainly (they wait for the kernel before them as any plain launch does), they let the next kernel launch at their
# start. The attention's programs then take SM slots as the QKV programs leave, while the last ones (the QK-norm
# tail, the slowest) still run, and spend that time on what does not depend on the QKV kernel: the sequence length
# and an L2 prefetch of their first key / value tile (attention_triton._prefetch_split_kv). Without the trigger a
# dependent launches only when the whole QKV grid has left, and its wait comes at once. H100, qwen3-1.7b fp16, depth
# 512, PDL off (ncu / torch profiler, 2026-12-05): the attention kernel took 6.5-7.2 us a layer for 2 MB of keys and
# values (0.16% of DRAM throughput, 6% occupancy): a chain of latencies, not bytes. With the trigger and the prefetch
# against the prefetch alone (H100, same call, interleaved, 5 repeats, tools/pdl_sweep.py, now tools/step_ab.py's pdl:
# arms; levels ``attn`` against ``fused_attn_proj_residual+fused_attn_proj``: the attention at 2 prefetches in both, but
# without the trigger it has no time to): qwen3-1.7b fp16 606.4 -> 613.1 tok/s (+1.1%), gemma-3-1b fp16 694.7 -> 694.9
# (no change). A small step; not measured on the H200, nor against the tree before the prefetch.
AFTER_ATTENTION = "attn"
TRIGGER = 3
QKV_OPS = ("fused_norm_qkv_rope", "fused_norm_qkv_qknorm_rope")
AFTER_ATTENTION_OPS = {"fused_attn_proj_residual": 2, "fused_attn_proj": 2, **{op: TRIGGER for op in QKV_OPS}}
StepAsk = int | dict

_ARCH_BY_DEVICE: dict[int, int] = {}
_STEP_LEVEL: ContextVar[StepAsk] = ContextVar("edgekit_pdl_step_level", default=0)


def requested_level() -> StepAsk | None:
    """What ``EDGEKIT_PDL`` forces (None when unset: each decode step decides): a level for every launch, or
    ``attn`` for the attention operators' launches only; a clear error for a bad value."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    ask = _parsed_ask(raw)
    return dict(ask) if isinstance(ask, dict) else ask  # a copy: the parse is cached


@lru_cache(maxsize=8)
def _parsed_ask(raw: str) -> StepAsk:
    """``EDGEKIT_PDL``'s value parsed once per value: the JIT launcher asks on every launch, and a list of operators
    is checked against the registry (a bad value raises every time: errors are not cached)."""
    from edgekit.errors import OperatorError

    if raw in {str(v) for v in LEVELS}:
        return int(raw)
    names = raw.split("+")  # operators at level 2, the others plain (how the sweeps try a policy)
    unknown = [n for n in names if n != AFTER_ATTENTION and n not in _pdl_operators()]
    if unknown:
        raise OperatorError(f"{ENV}={raw!r}; expected one of {', '.join(map(str, LEVELS))}, {AFTER_ATTENTION}, or "
                            f"operators joined by '+' (level 2 for those only); unknown: {', '.join(unknown)}",
                            hint=f"0 off, 1 overlap launches, 2 also prefetch weights, {AFTER_ATTENTION}: 2 for the "
                                 f"attention operators and the QKV operators' early trigger ({TRIGGER}); unset {ENV} "
                                 f"to let the decode step decide")
    # ``attn`` first, then the named operators at 2 whatever the order (a named QKV operator waits, not triggers)
    ask = dict(AFTER_ATTENTION_OPS) if AFTER_ATTENTION in names else {}
    ask.update({n: 2 for n in names if n != AFTER_ATTENTION})
    return ask


def _pdl_operators() -> set[str]:
    """The operators with kernels (a name outside them is a typo; their Triton modules are not imported here)."""
    from edgekit.kernels.registry import with_kernels

    return set(with_kernels())


# Above the bound, PDL for the attention operators only (AFTER_ATTENTION_OPS) against none, measured on the H200
# (2026-12-04, batch 1, depth 512, random weights, interleaved runs, tools/pdl_sweep.py, now tools/step_ab.py's pdl:
# arms): qwen3-1.7b fp16 722.6 -> 741.5 tok/s, int8 911.3 -> 938.4, int4 969.3 -> 992.7; qwen3-0.6b fp16 1143.4 ->
# 1197.3, int8 1292.5 -> 1339.0; gemma-3-1b fp16 726.4 -> 741.4; llama-3.2-1b fp16 1143.3 -> 1161.0. Adding the gate/up
# GEMV (733.4), the QKV GEMV (711.8) or it and the down projection (711.8) to the attention operators lost at qwen3-1.7b
# fp16 (attn: 744.7 in the same runs): a GEMV launched early takes SM slots from the bandwidth-bound kernel before it.
# Letting it launch only after the kernel before has streamed its weights (that kernel's trigger after its K loop) lost
# too (H100, 2026-12-05: qwen3-1.7b fp16 -2.9%, gemma-3-1b fp16 -2.9%; tools/step_ab.py's docstring).
def auto_level(weight_bytes_per_kernel: float) -> StepAsk:
    """What a decode step whose GEMV kernels read this many weight bytes each (mean) asks for."""
    if weight_bytes_per_kernel <= AUTO_MAX_WEIGHT_BYTES_PER_KERNEL:
        return DEFAULT_LEVEL
    return dict(AFTER_ATTENTION_OPS)


def _level_of(ask: StepAsk, op: str | None) -> int:
    return int(ask.get(op, 0)) if isinstance(ask, dict) else int(ask)


def level_for(arch: int, forced: StepAsk | None, step: StepAsk, op: str | None = None) -> int:
    """The level of one launch of operator ``op``'s kernel on an sm_<arch> GPU: 0 below sm_90 whatever was asked,
    else what EDGEKIT_PDL forces, else what the decode step being launched asks (0 outside one)."""
    if arch < MIN_ARCH:
        return 0
    return _level_of(step if forced is None else forced, op)


@contextmanager
def step_launches(level: StepAsk):
    """Launches made inside use PDL as ``level`` asks (unless EDGEKIT_PDL forces it): a decode step's choice."""
    token = _STEP_LEVEL.set(level)
    try:
        yield
    finally:
        _STEP_LEVEL.reset(token)


def jit_launch_options(device, op: str | None = None) -> dict:
    """Keyword arguments for a Triton JIT launch of operator ``op``'s kernel with the PDL switch on ``device`` now
    ({}: plain)."""
    level = pdl_level(device, op)
    if level == TRIGGER:
        return {"PDL": level}  # a plain launch that lets the next kernel launch at its start
    return {"PDL": level, "launch_pdl": True} if level else {}


def pdl_level(device, op: str | None = None) -> int:
    """The level the JIT launcher uses for a launch of operator ``op``'s kernel on ``device`` (a torch device) now:
    0 for the CPU interpreter."""
    import torch

    if device is None or device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _ARCH_BY_DEVICE:
        _ARCH_BY_DEVICE[index] = arch_of_capability(*torch.cuda.get_device_capability(index))
    return level_for(_ARCH_BY_DEVICE[index], requested_level(), _STEP_LEVEL.get(), op)
