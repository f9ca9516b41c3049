"""Run an operator's launch program on a CUDA device, with any kernel launcher.

One executor serves both paths: the Triton JIT (``JitLaunchers``: tests,
benchmarks, the GPU dispatch table) and compiled plugins loaded with
cuda-python (``edgekit.kernels.launcher``). It allocates the program's buffers
with torch on the call's device (so launches and allocations are captured by a
CUDA graph like any torch work), checks that every pointer argument matches
the kernel signature's dtype, and launches on torch's current stream.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Protocol

import torch

from edgekit.kernels.arch import arch_of_capability
from edgekit.kernels.launch_rule import LaunchCheckError, Pointer, dtype_name, resolve_program

TORCH_DTYPES = {
    "fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64,
    "u8": torch.uint8, "i8": torch.int8, "i32": torch.int32, "i64": torch.int64,
}

_DEVICE_PROPS: dict[int, dict[str, int]] = {}
_SEEN_SMS = threading.local()  # per thread: the SM count launch rules see instead of the device's (launch_sm_count)


@contextmanager
def launch_sm_count(sm_count: int | None) -> Iterator[None]:
    """Launch rules run on this thread see ``sm_count`` SMs (None: the device's own count).

    Why: work confined to part of a GPU (a CUDA green context, edgekit.bench.sm_partition) still reads the whole
    device from ``torch.cuda.get_device_properties``, so a rule that sizes its grid by the SM count (split-K GEMV,
    split-KV attention) would size it for 132 SMs while 8 run it. An Orin reports its own 16 (or a power mode's 8).
    Grids are resolved at each call, so a CUDA graph captured inside keeps the grids sized here.
    """
    if sm_count is not None and sm_count < 1:
        raise ValueError(f"launch rules need a positive SM count, got {sm_count}")
    before = getattr(_SEEN_SMS, "n", None)
    _SEEN_SMS.n = sm_count
    try:
        yield
    finally:
        _SEEN_SMS.n = before


def device_properties(device: torch.device) -> dict[str, int]:
    """The device facts a launch rule may read (``{"device": "sm_count"}``); the SM count as ``launch_sm_count`` sets it.
    ``arch``: 10 * major + minor of its compute capability (0 for the pretend device); ``max_shared_bytes`` /
    ``shared_bytes_per_sm``: a block's opt-in shared memory and an SM's (0 where this torch does not report them)."""
    if device.type != "cuda":  # Triton's CPU interpreter (tests): a pretend device
        props = {"sm_count": 8, "max_shared_bytes": 0, "shared_bytes_per_sm": 0, "arch": 0}
    else:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in _DEVICE_PROPS:
            p = torch.cuda.get_device_properties(index)
            smem = getattr(p, "shared_memory_per_block_optin", 0) or getattr(p, "max_shared_memory_per_block_optin", 0)
            per_sm = getattr(p, "shared_memory_per_multiprocessor", 0) or getattr(p, "max_shared_memory_per_multiprocessor", 0)
            _DEVICE_PROPS[index] = {"sm_count": int(p.multi_processor_count), "max_shared_bytes": int(smem or 0),
                                    "shared_bytes_per_sm": int(per_sm or 0), "arch": arch_of_capability(p.major, p.minor)}
        props = _DEVICE_PROPS[index]
    seen = getattr(_SEEN_SMS, "n", None)
    return props if seen is None else {**props, "sm_count": seen}


class Launcher(Protocol):
    """Launches one kernel: ``signature`` is its ordered (name, type) list."""

    signature: list[tuple[str, str]]

    def launch(self, grid: tuple[int, int, int], args: list, stream: int) -> None: ...


def normalise_args(kernel: str, signature: list[tuple[str, str]], args: list, arg_desc: list[str]) -> list:
    """Check each argument against the signature; pointer args become Pointer (0 = null)."""
    if len(args) != len(signature):
        raise LaunchCheckError(f"{kernel}: the rule passes {len(args)} arguments, the kernel takes {len(signature)}")
    out = []
    for (name, typ), value, desc in zip(signature, args, arg_desc):
        if typ.startswith("*"):
            if not isinstance(value, Pointer):
                if value != 0:
                    raise LaunchCheckError(f"{kernel}: argument {name} ({typ}) got a non-pointer value {value!r} from {desc}")
                value = Pointer.of(None)
            t = value.tensor
            if t is not None and dtype_name(t.dtype) != typ[1:]:
                raise LaunchCheckError(f"{kernel}: argument {name} expects {typ[1:]} data but {desc} is {t.dtype}")
        elif typ in ("i32", "i64", "u32", "u64"):
            if not isinstance(value, int) or isinstance(value, Pointer):
                raise LaunchCheckError(f"{kernel}: argument {name} ({typ}) got {value!r} from {desc}")
            lim = 2**31 if typ == "i32" else 2**63
            if not -lim <= value < lim:
                raise LaunchCheckError(f"{kernel}: argument {name} = {value} does not fit {typ}")
        elif typ in ("fp32", "fp64", "fp16"):
            if not isinstance(value, (int, float)) or isinstance(value, Pointer):
                raise LaunchCheckError(f"{kernel}: argument {name} ({typ}) got {value!r} from {desc}")
            value = float(value)
        else:
            raise LaunchCheckError(f"{kernel}: argument {name} has unsupported type {typ!r}")
        out.append(value)
    return out


def run_program(
    program: dict,
    tensors: Mapping[str, torch.Tensor | None],
    attrs: Mapping[str, Any],
    launchers: Mapping[str, Launcher] | Callable[[str], Launcher],
    device: torch.device | None = None,
) -> dict[str, torch.Tensor]:
    """Resolve and launch a validated program; returns its buffers (outputs and workspaces) by name."""
    if device is None:
        device = next(t.device for t in tensors.values() if t is not None)

    def allocate(name: str, shape: list[int], dt: str) -> torch.Tensor:
        return torch.empty(shape, dtype=TORCH_DTYPES[dt], device=device)

    buffers, launches = resolve_program(program, tensors, attrs, device_properties(device), allocate)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    get = launchers if callable(launchers) else launchers.__getitem__
    for ln in launches:
        launcher = get(ln.kernel)
        args = normalise_args(ln.kernel, launcher.signature, ln.args, ln.arg_names)
        launcher.launch(ln.grid, args, stream)
    return buffers


class JitLauncher:
    """Launches a KernelVariant through Triton's JIT (compiles on first use, for the current GPU)."""

    def __init__(self, variant):
        from edgekit.kernels.variants import validate_variant

        self.variant = variant
        self.kdef = validate_variant(variant)
        self.signature = self.kdef.signature(variant.dtype)
        self._null: dict[tuple, torch.Tensor] = {}

    def _null_tensor(self, typ: str, device: torch.device) -> torch.Tensor:
        # A never-read stand-in for a null pointer: Triton's JIT needs a typed tensor, not 0.
        key = (typ, str(device))
        if key not in self._null:
            self._null[key] = torch.zeros(16, dtype=TORCH_DTYPES[typ[1:]], device=device)
        return self._null[key]

    def launch(self, grid, args, stream) -> None:
        device = next((a.tensor.device for a in args if isinstance(a, Pointer) and a.tensor is not None), None)
        call_args = []
        for (name, typ), a in zip(self.signature, args):
            if typ.startswith("*"):
                call_args.append(a.tensor if a.tensor is not None else self._null_tensor(typ, device))
            else:
                call_args.append(a)
        v = self.variant
        launch = {}
        if self.kdef.pdl:  # programmatic dependent launch where the running decode step asks for it (sm_90+)
            from edgekit.kernels.pdl_triton import jit_launch_options

            launch = jit_launch_options(device, self.kdef.op)
        # Triton's JIT launches on torch's current stream (the `stream` argument is the same stream).
        self.kdef.fn[tuple(grid)](*call_args, **dict(v.constexprs), **self.kdef.launch_constexprs(v.num_stages),
                                  **launch, num_warps=v.num_warps, num_stages=v.num_stages)
