"""Load compiled kernels (cubin or PTX) with cuda-python and launch them: the device runtime's kernel path.

This is trusted edgekit code that runs untrusted *data*: a plugin's cubin/PTX
and its JSON metadata and launch program. Nothing in a plugin is imported or
evaluated as Python.

- ``LoadedKernel``: one kernel in its own CUDA module. Loads the cubin when it
  was built for this GPU's exact arch, else JIT-compiles the PTX (a PTX for an
  older arch runs on newer GPUs); raises the dynamic shared-memory limit above
  48 KB; launches on a given stream with the hidden scratch arguments of its
  Triton ABI; unloads its module. Every CUresult is checked.
- ``PluginOp``: an operator made of loaded kernels and the launch program that
  drives them; callable with the same arguments as the operator's reference,
  so it drops into a ``DispatchTable`` (hot swap = one ``table.set``).

Launches go to torch's current stream, so they are recorded into CUDA graphs
like any other work. A module must outlive every graph captured with it:
unload only after those graphs are gone (see shared notes, gpu-apis.md).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Mapping

import torch

from edgekit.errors import BundleError, OperatorError
from edgekit.kernels.abi import hidden_args_for
from edgekit.kernels.arch import arch_name, arch_of_capability
from edgekit.kernels.launch_rule import Pointer, validate_program

MAX_STATIC_SHARED = 48 * 1024  # above this a kernel must opt in to dynamic shared memory


class KernelLoadError(BundleError):
    """A compiled kernel could not be loaded or launched on this GPU."""


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python < 12.6 layout
        except ImportError as e:
            raise KernelLoadError("cuda-python is not installed; loading compiled kernels needs it",
                                  hint="pip install 'edgekit[gpu]' (cuda-python)") from e
    return driver


def _check(result, what: str):
    """Unpack a cuda-python call result (error first) or raise KernelLoadError naming the CUDA error."""
    driver = _driver()
    err, rest = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if err != driver.CUresult.CUDA_SUCCESS:
        try:
            name = driver.cuGetErrorName(err)[1].decode()
        except Exception:  # the name is only decoration for the message
            name = str(err)
        raise KernelLoadError(f"{what} failed: {name}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def _cuda_device(device: torch.device | int | str | None) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    return d if d.index is not None else torch.device("cuda", torch.cuda.current_device())


def device_arch(device: torch.device | int | None = None) -> int:
    return arch_of_capability(*torch.cuda.get_device_capability(device))


_CTYPES = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "u32": ctypes.c_uint32, "u64": ctypes.c_uint64,
           "fp32": ctypes.c_float, "fp64": ctypes.c_double}


class LoadedKernel:
    """One compiled Triton kernel, loaded into its own CUDA module."""

    def __init__(self, *, name: str, signature: list[tuple[str, str]], shared_bytes: int, num_warps: int,
                 triton_version: str, hidden_args: int, global_scratch_size: int = 0, global_scratch_align: int = 1,
                 cubin: bytes | None = None, ptx: str | None = None, arch: int | None = None,
                 device: torch.device | int | None = None, prefer: str = "auto"):
        abi_hidden = hidden_args_for(triton_version)  # refuses unknown Triton ABIs
        if hidden_args != abi_hidden:
            raise KernelLoadError(f"kernel {name}: metadata says {hidden_args} hidden arguments, Triton "
                                  f"{triton_version} kernels take {abi_hidden}")
        for pname, typ in signature:
            if not typ.startswith("*") and typ not in _CTYPES:
                raise KernelLoadError(f"kernel {name}: parameter {pname} has unsupported type {typ!r}")
        self.name = name
        self.signature = [tuple(p) for p in signature]
        self.shared_bytes = int(shared_bytes)
        self.num_warps = int(num_warps)
        self.hidden_args = hidden_args
        self.global_scratch_size = int(global_scratch_size)
        self.global_scratch_align = max(1, int(global_scratch_align))
        self.device = _cuda_device(device)
        self._lock = threading.Lock()
        self._module = None
        self._function = None
        self.loaded_from = self._load(cubin, ptx, arch, prefer)

    @classmethod
    def from_compiled(cls, ck, *, device=None, prefer: str = "auto") -> "LoadedKernel":
        """From an ``aot.CompiledKernel``."""
        return cls(name=ck.name, signature=ck.signature, shared_bytes=ck.shared_bytes, num_warps=ck.num_warps,
                   triton_version=ck.triton_version, hidden_args=ck.hidden_args,
                   global_scratch_size=ck.global_scratch_size, global_scratch_align=ck.global_scratch_align,
                   cubin=ck.cubin, ptx=ck.ptx, arch=ck.arch, device=device, prefer=prefer)

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], *, cubin: bytes | None, ptx: str | None, device=None,
                      prefer: str = "auto") -> "LoadedKernel":
        """From plugin metadata (``CompiledKernel.metadata()`` as JSON) and the plugin's binaries."""
        try:
            return cls(name=str(meta["name"]), signature=[(str(a), str(b)) for a, b in meta["signature"]],
                       shared_bytes=int(meta["shared_bytes"]), num_warps=int(meta["num_warps"]),
                       triton_version=str(meta["triton_version"]), hidden_args=int(meta["hidden_args"]),
                       global_scratch_size=int(meta.get("global_scratch_size", 0)),
                       global_scratch_align=int(meta.get("global_scratch_align", 1)),
                       cubin=cubin, ptx=ptx, arch=int(meta["arch"]), device=device, prefer=prefer)
        except (KeyError, TypeError, ValueError) as e:
            raise KernelLoadError(f"kernel metadata is incomplete or malformed: {e!r}",
                                  hint="expected the fields written by edgekit.kernels.aot.CompiledKernel.metadata()") from e

    # -- loading ------------------------------------------------------------
    def _load(self, cubin, ptx, arch, prefer) -> str:
        driver = _driver()
        here = device_arch(self.device)
        if prefer not in ("auto", "cubin", "ptx"):
            raise KernelLoadError(f"prefer must be 'auto', 'cubin' or 'ptx', got {prefer!r}")
        use_cubin = cubin is not None and arch == here and prefer in ("auto", "cubin")
        if prefer == "cubin" and not use_cubin:
            raise KernelLoadError(f"kernel {self.name}: cubin for {arch_name(arch)} cannot run on this {arch_name(here)} GPU")
        if not use_cubin:
            if ptx is None:
                raise KernelLoadError(f"kernel {self.name}: built for {arch_name(arch)}, this GPU is {arch_name(here)}, and no PTX was given")
            if arch is not None and arch > here:
                raise KernelLoadError(f"kernel {self.name}: PTX for {arch_name(arch)} cannot JIT to the older {arch_name(here)}")
        image = cubin if use_cubin else ptx.encode() + b"\0"
        with torch.cuda.device(self.device):
            torch.zeros(1, device=self.device)  # torch's primary context is current on this thread
            self._module = _check(driver.cuModuleLoadData(image), f"cuModuleLoadData({self.name})")
        try:
            self._function = _check(driver.cuModuleGetFunction(self._module, self.name.encode()),
                                    f"cuModuleGetFunction({self.name})")
            if self.shared_bytes > MAX_STATIC_SHARED:
                dev = _check(driver.cuDeviceGet(self.device.index), "cuDeviceGet")
                limit = _check(driver.cuDeviceGetAttribute(
                    driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
                    "cuDeviceGetAttribute")
                if self.shared_bytes > limit:
                    raise KernelLoadError(f"kernel {self.name} needs {self.shared_bytes} bytes of shared memory; "
                                          f"this GPU allows {limit} per block")
                _check(driver.cuFuncSetAttribute(
                    self._function, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    self.shared_bytes), f"cuFuncSetAttribute({self.name})")
        except BaseException:
            self.unload()
            raise
        return "cubin" if use_cubin else "ptx"

    # -- launching ----------------------------------------------------------
    def launch(self, grid: tuple[int, int, int], args: list, stream: int | None = None) -> None:
        """Launch with ``args`` in signature order (pointers as ints or Pointer; 0 is null) on ``stream``."""
        driver = _driver()
        if self._function is None:
            raise KernelLoadError(f"kernel {self.name} was unloaded")
        if len(args) != len(self.signature):
            raise OperatorError(f"kernel {self.name} takes {len(self.signature)} arguments, got {len(args)}")
        values, types = [], []
        for (pname, typ), a in zip(self.signature, args):
            if typ.startswith("*"):
                addr = int(a)
                if addr % 16:
                    raise OperatorError(f"kernel {self.name}: {pname} address {addr:#x} is not 16-byte aligned, "
                                        "which the compiled code assumes", hint="pass tensors that start on 16 bytes")
                values.append(addr)
                types.append(ctypes.c_void_p)
            else:
                values.append(a)
                types.append(_CTYPES[typ])
        scratch = None
        if self.global_scratch_size > 0:
            n = grid[0] * grid[1] * grid[2] * self.global_scratch_size + self.global_scratch_align
            scratch = torch.empty(n, dtype=torch.uint8, device=self.device)
            base = scratch.data_ptr()
            base += (-base) % self.global_scratch_align
            values.append(base)
        else:
            values.append(0)
        types.append(ctypes.c_void_p)
        for _ in range(self.hidden_args - 1):  # profile scratch (3.5+): unused without instrumentation
            values.append(0)
            types.append(ctypes.c_void_p)
        if stream is None:
            stream = torch.cuda.current_stream(self.device).cuda_stream
        with self._lock, torch.cuda.device(self.device):
            _check(driver.cuLaunchKernel(
                self._function, int(grid[0]), int(grid[1]), int(grid[2]), 32 * self.num_warps, 1, 1,
                self.shared_bytes, driver.CUstream(int(stream)), (tuple(values), tuple(types)), 0),
                f"cuLaunchKernel({self.name})")
        del scratch  # the caching allocator keeps it for this stream until the kernel has run

    def unload(self) -> None:
        """Unload the module. Only once no launch (or captured graph) can still use it."""
        if self._module is not None:
            module, self._module, self._function = self._module, None, None
            _check(_driver().cuModuleUnload(module), f"cuModuleUnload({self.name})")

    @property
    def loaded(self) -> bool:
        return self._function is not None


class PluginOp:
    """An operator run from loaded kernels and a launch program; callable like the operator's reference."""

    def __init__(self, op: str, program: dict, kernels: Mapping[str, LoadedKernel]):
        # the operator's host side comes from its registry record, never from its Triton module: a device runs
        # compiled plugins without Triton installed
        from edgekit.kernels.registry import OPERATORS

        record = OPERATORS.get(op)
        if record is None or record.prepare is None:
            raise KernelLoadError(f"plugin for unknown operator {op!r}")
        if program.get("op") != op:
            raise KernelLoadError(f"plugin program is for {program.get('op')!r}, not {op!r}")
        self.program = validate_program(program, {name: len(k.signature) for name, k in kernels.items()})
        self.op = op
        self.kernels = dict(kernels)
        self._prepare = record.prepare

    def __call__(self, *args):
        from edgekit.kernels.program_runner import run_program

        tensors, attrs, finish = self._prepare(*args)
        return finish(run_program(self.program, tensors, attrs, self.kernels))

    def unload(self) -> None:
        for k in self.kernels.values():
            k.unload()


__all__ = ["KernelLoadError", "LoadedKernel", "PluginOp", "Pointer", "device_arch"]
