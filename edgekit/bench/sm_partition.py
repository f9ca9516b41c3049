"""Confine GPU work to N SMs with a CUDA green context: an Orin-shaped slice of a large GPU.

An AGX Orin has 16 SMs (8 in its 30 W mode); the H200 edgekit is measured on has 132. A green context is a CUDA
context provisioned with a subset of the device's SMs: kernels launched into one of its streams run only on those
SMs, while memory (and its bandwidth) stays the whole device's. That is the closest an H200 gets to an Orin's
compute: same kernels, an Orin's SM count, an HBM far faster than LPDDR5 (so the copy bandwidth is measured inside
the partition and the decode is reported against it).

The APIs, tried in this order (read from their sources; not yet run on a GPU from this code):

1. torch's ``torch.cuda.green_contexts.GreenContext`` (torch 2.9+; ``Stream()`` from 2.11).
   ``GreenContext.create(num_sms=n, device_id=i)`` (keyword form: 2.10/2.11's shim takes ``(num_sms, device_id=0)``,
   2.12+ only keywords) runs, in aten/src/ATen/cuda/CUDAGreenContext.cpp: cuDeviceGetDevResource(SM) ->
   cuDevSmResourceSplitByCount(1 group, minCount n) -> cuDevResourceGenerateDesc -> cuGreenCtxCreate(...,
   CU_GREEN_CTX_DEFAULT_STREAM) -> cuCtxFromGreenCtx, refusing n outside [1, device SMs]. ``ctx.Stream()`` makes a
   stream *in* the green context with cuGreenCtxStreamCreate(CU_STREAM_NON_BLOCKING) and returns it as a
   ``torch.cuda.ExternalStream`` (torch/csrc/cuda/GreenContext.cpp). torch 2.11 does not say how many SMs it got;
   newer torch has ``ctx.sm_partition.sm_count``; otherwise the same split is repeated here with cuda-python (the
   split of the same device resource with the same request is the same).
   ``set_context()`` / ``pop_context()`` are not used: they push the green context and make torch's *default*
   stream current (CUDA graphs cannot be captured on it), and later torch deprecates them.
2. cuda-python's driver API (``cuda.bindings.driver``; CUDA 12.4+ driver): the same calls made here, the stream from
   cuGreenCtxStreamCreate wrapped with ``torch.cuda.ExternalStream``; the SM count is the split group's
   ``sm.smCount``. Used when torch's API is missing or has no ``Stream()`` (torch 2.9/2.10).

CUDA rounds a request to the architecture's granularity (on sm_90 a group is a multiple of 8 SMs, at least 8):
``Partition.sm_count`` is what the resource holds, which is what is reported, not the number asked for.

Which work is confined, and why ``confined`` does more than make the partition's stream current:

- A stream runs its work with the SMs of the context it was created in. cuStreamGetGreenCtx (CUDA driver API
  reference): a stream made with cuStreamCreate/cudaStreamCreate belongs to a green context only if one was current
  on the calling thread *when the stream was created*.
- ``torch.cuda.Stream()`` creates nothing: it hands out one of torch's pooled streams (torch/csrc/cuda/Stream.cpp
  THCPStream_pynew -> at::cuda::getStreamFromPool), made once per device when the pool is first used, in the
  context current then (the primary one, in practice: the pool is filled long before any partition). So the side
  streams the engines make for warm-ups, and the one ``torch.cuda.graph`` captures on by default, are *not* in the
  green context even while its stream is current: their kernels would run on all 132 SMs. ``confined`` pins those to
  the partition's stream (edgekit.runtime.gpu_admin_lock.pinned_stream), so the warm-up, the capture and every
  replay of the decode step's CUDA graph run on the partition's stream.
- Replay (``CUDAGraph.replay``) launches on the current stream: the partition's.
- Triton's JIT and edgekit's plugin launcher launch on torch's current stream; modules stay loaded in the primary
  context (green contexts share the primary context's memory; launching its kernels into a green context's stream
  is how torch's own operators run there too).
- Launch rules that size a grid by the SM count read the whole device from ``get_device_properties``; ``confined``
  makes them see the partition's count (edgekit.kernels.program_runner.launch_sm_count).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

TORCH_API = "torch.cuda.green_contexts.GreenContext.create(num_sms=, device_id=) + .Stream()"
DRIVER_API = ("cuda-python driver: cuDevSmResourceSplitByCount -> cuDevResourceGenerateDesc -> cuGreenCtxCreate -> "
              "cuGreenCtxStreamCreate")


@dataclass
class Partition:
    """A green context holding ``sm_count`` of the device's SMs, and a stream in it."""

    requested_sms: int
    sm_count: int | None  # SMs the green context's resource holds (None: could not be read; see sm_count_source)
    sm_count_source: str
    device_sms: int
    api: str
    stream: Any  # torch.cuda.Stream (an ExternalStream) created in the green context
    handle: Any = field(default=None, repr=False)  # what keeps the green context alive (torch's GreenContext)
    _release: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def launch_sms(self) -> int:
        """The SM count launch rules see inside: what the partition holds (the request where that is unknown)."""
        return self.sm_count or self.requested_sms

    def close(self) -> None:
        """Drain the stream and release the green context (torch destroys its own when the last reference goes; the
        stream it made is never destroyed). Call once no tensor made inside is in use and the allocator's cache is
        emptied: its blocks remember the stream."""
        if self.stream is not None:
            self.stream.synchronize()
            if self._release is not None:
                self._release()
            self.stream, self.handle, self._release = None, None, None


@dataclass(frozen=True)
class Unavailable:
    """No green context for this request, and why (each API tried, with its own reason)."""

    requested_sms: int
    reason: str


def driver_module():
    """cuda-python's driver bindings, or a string saying why not."""
    try:
        from cuda.bindings import driver  # cuda-bindings 12.6+ / 13

        return driver
    except ImportError:
        try:
            from cuda import cuda as driver  # older cuda-python 12.x

            return driver
        except ImportError as e:
            return f"cuda-python is not installed ({e})"


def torch_green_contexts():
    """torch.cuda.green_contexts, or a string saying why it cannot make a partition here."""
    try:
        import torch.cuda.green_contexts as gc
    except ImportError as e:
        return f"torch {torch.__version__} has no torch.cuda.green_contexts ({e})"
    if not getattr(gc, "SUPPORTED", True):  # 2.9-2.14: False when torch._C has no _CUDAGreenContext
        return f"torch {torch.__version__} was built without green-context support (no torch._C._CUDAGreenContext)"
    return gc


def _ok(result, what: str):
    """A cuda-python call's values once its CUresult (first) is CUDA_SUCCESS; RuntimeError naming the call otherwise."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(getattr(err, "value", err)) != 0:
        raise RuntimeError(f"{what} failed: {err!r}")
    return values[0] if len(values) == 1 else tuple(values)


def split_sm_count(driver, device_index: int, num_sms: int) -> tuple[Any, Any, int]:
    """(CUdevice, the SM resource group CUDA gives for ``num_sms``, its SM count): the split torch's create makes too."""
    _ok(driver.cuInit(0), "cuInit")
    dev = _ok(driver.cuDeviceGet(device_index), "cuDeviceGet")
    whole = _ok(driver.cuDeviceGetDevResource(dev, driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM),
                "cuDeviceGetDevResource(SM)")
    groups, n_groups, _rest = _ok(driver.cuDevSmResourceSplitByCount(1, whole, 0, num_sms),
                                  f"cuDevSmResourceSplitByCount(1 group, minCount {num_sms})")
    if int(n_groups) != 1:
        raise RuntimeError(f"cuDevSmResourceSplitByCount gave {n_groups} groups of >= {num_sms} SMs, not 1")
    return dev, groups[0], int(groups[0].sm.smCount)


def _torch_partition(gc, driver, num_sms: int, index: int, device_sms: int) -> Partition:
    ctx = gc.GreenContext.create(num_sms=num_sms, device_id=index)
    if not hasattr(ctx, "Stream"):
        raise RuntimeError(f"torch {torch.__version__}'s GreenContext has no Stream() (torch 2.11 added it), so no "
                           "stream of the green context can be had through torch")
    stream = ctx.Stream()
    got, source = None, ""
    part = getattr(ctx, "sm_partition", None)  # newer torch: the SMPartition the context was made from
    if part is not None and getattr(part, "sm_count", None):
        got, source = int(part.sm_count), "the green context's sm_partition.sm_count (torch)"
    elif not isinstance(driver, str):
        try:
            got = split_sm_count(driver, index, num_sms)[2]
            source = "cuDevSmResourceSplitByCount of the same request (cuda-python), as torch's create splits"
        except RuntimeError as e:
            source = f"unknown: repeating torch's split with cuda-python failed ({e})"
    else:
        source = f"unknown: torch does not report it and {driver}"
    return Partition(num_sms, got, source, device_sms, TORCH_API, stream, handle=ctx)


def _driver_partition(driver, num_sms: int, index: int, device_sms: int, device: torch.device) -> Partition:
    dev, group, got = split_sm_count(driver, index, num_sms)
    desc = _ok(driver.cuDevResourceGenerateDesc([group], 1), "cuDevResourceGenerateDesc")
    green = _ok(driver.cuGreenCtxCreate(desc, dev, driver.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM),
                "cuGreenCtxCreate")
    try:
        raw = _ok(driver.cuGreenCtxStreamCreate(green, driver.CUstream_flags.CU_STREAM_NON_BLOCKING, 0),
                  "cuGreenCtxStreamCreate")
    except RuntimeError:
        driver.cuGreenCtxDestroy(green)
        raise
    stream = torch.cuda.ExternalStream(int(raw), device=device)

    def release() -> None:
        driver.cuStreamDestroy(raw)
        driver.cuGreenCtxDestroy(green)

    return Partition(num_sms, got, "the split group's sm.smCount (cuda-python)", device_sms, DRIVER_API, stream,
                     _release=release)


def open_partition(num_sms: int, device: torch.device, *, gc=None, driver=None) -> Partition | Unavailable:
    """A green context of ``num_sms`` SMs on ``device`` (torch's API, else cuda-python's), or why there is none.

    ``gc`` / ``driver``: torch.cuda.green_contexts and cuda-python's driver module, or strings saying why they are
    missing (tests inject them); None finds them.
    """
    if num_sms < 1:
        raise ValueError(f"an SM partition needs at least 1 SM, got {num_sms}")
    if device.type != "cuda":
        return Unavailable(num_sms, f"SM partitions (CUDA green contexts) need a CUDA GPU; this run is on {device.type}")
    if not torch.cuda.is_available():
        return Unavailable(num_sms, "no CUDA device is visible to torch")
    index = device.index if device.index is not None else torch.cuda.current_device()
    device_sms = int(torch.cuda.get_device_properties(index).multi_processor_count)
    if num_sms > device_sms:
        return Unavailable(num_sms, f"{num_sms} SMs asked for; {torch.cuda.get_device_name(index)} has {device_sms}")
    torch.cuda.init()  # the primary context first: green contexts are made beside it
    return open_on(num_sms, index, device_sms, device, torch_green_contexts() if gc is None else gc,
                   driver_module() if driver is None else driver)


def open_on(num_sms: int, index: int, device_sms: int, device: torch.device, gc, driver) -> Partition | Unavailable:
    """torch's green context where it can make one with a stream of its own, else cuda-python's, else why neither."""
    reasons = []
    if isinstance(gc, str):
        reasons.append(gc)
    else:
        try:
            return _torch_partition(gc, driver, num_sms, index, device_sms)
        except Exception as e:  # noqa: BLE001 - a build, driver or version that cannot: the next API, and say why
            reasons.append(f"torch's green context: {type(e).__name__}: {e}")
    if isinstance(driver, str):
        reasons.append(driver)
    else:
        try:
            return _driver_partition(driver, num_sms, index, device_sms, device)
        except Exception as e:  # noqa: BLE001 - e.g. AttributeError: bindings older than the green-context API
            reasons.append(f"cuda-python's driver API: {type(e).__name__}: {e}")
    return Unavailable(num_sms, "no green context: " + "; ".join(reasons))


@contextmanager
def confined(part: Partition | None, launch_sms: int | None) -> Iterator[None]:
    """Work this thread launches runs in ``part`` (None: on the whole device), launch rules seeing ``launch_sms`` SMs.

    Inside: the partition's stream is current and pinned (warm-ups and graph captures use it, not torch's pooled side
    streams: see the module notes). The stream is drained on the way out, so timings and tensors read afterwards on
    another stream see finished work.
    """
    from edgekit.kernels.program_runner import launch_sm_count
    from edgekit.runtime.gpu_admin_lock import pinned_stream

    with launch_sm_count(launch_sms):
        if part is None:
            yield
            return
        with torch.cuda.stream(part.stream), pinned_stream(part.stream):
            yield
        part.stream.synchronize()  # (not after an error: the caller gets the error itself, not a second one)


def seen_sms(part: Partition, device: torch.device) -> list[int]:
    """The SM ids a wide probe grid launched into ``part`` ran on (edgekit.bench.sm_probe)."""
    from edgekit.bench.sm_probe import seen_sms as probe

    with confined(part, part.launch_sms):
        return probe(device, part.device_sms)
