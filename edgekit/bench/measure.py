"""Timers, the device-copy bandwidth and the energy meter.

GPU work is asynchronous: a region is timed with CUDA events recorded on the
current stream around it, and the end event is waited for before reading the
time. On the CPU the wall clock is enough. The energy meter differences the
NVML total-energy counter (mJ since the driver loaded) around a region; the
counter is what the board itself integrates, so no sampling rate is involved,
but it only resolves windows well above its refresh period: callers keep the
window long (``ENERGY_MIN_WINDOW_S``) and report its length.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch

T = TypeVar("T")

ENERGY_MIN_WINDOW_S = 0.5  # shortest decode window an energy figure is taken over


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], T], device: torch.device) -> tuple[T, float]:
    """(fn's result, seconds it took on ``device``), the device's queue drained at both ends."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        return out, start.elapsed_time(end) / 1000.0
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


COPY_METHODS = {
    "memcpy": "torch copy_ (a device-to-device cudaMemcpyAsync)",
    # an elementwise kernel runs on the SMs of the stream's context by construction: inside an SM partition it is
    # the copy the partition's own kernels can reach (whether the driver's memcpy honours a green context's SM set
    # is not documented)
    "kernel": "torch.mul(src, 1, out=dst) (an elementwise kernel on the SMs)",
}


def copy_bandwidth(device: torch.device, nbytes: int = 2 << 30, repeats: int = 10, via: str = "memcpy") -> dict:
    """Device-to-device copy of an ``nbytes`` buffer: (bytes read + bytes written) / median time.

    2 GiB is far beyond the 60 MB L2, so every repeat streams from HBM. Runs on the current stream. ``via``: "memcpy"
    (the benchmark's roofline) or "kernel" (an elementwise kernel: see COPY_METHODS).
    """
    if via not in COPY_METHODS:
        raise ValueError(f"copy via {via!r}; expected one of {sorted(COPY_METHODS)}")
    n = nbytes // 2
    src = torch.randint(-30000, 30000, (n,), dtype=torch.int16, device=device)  # random data, never zeros
    dst = torch.empty_like(src)

    def copy():
        if via == "memcpy":
            dst.copy_(src)
        else:
            torch.mul(src, 1, out=dst)

    for _ in range(2):
        copy()
    times = [timed(copy, device)[1] for _ in range(repeats)]
    if not torch.equal(dst[:1024], src[:1024]):
        raise RuntimeError("the bandwidth copy did not copy")
    t = median(times)
    return {
        "buffer_bytes": n * 2,
        "median_s": t,
        "bytes_per_s": 2 * n * 2 / t,  # read + write
        "repeats": repeats,
        "method": f"{COPY_METHODS[via]} of a {n * 2 / 2**30:g} GiB int16 buffer, CUDA events, median; bytes read + written",
    }


@dataclass
class EnergyWindow:
    energy_mj: float
    seconds: float

    @property
    def power_w(self) -> float:
        return self.energy_mj / 1000.0 / self.seconds if self.seconds > 0 else float("nan")


class EnergyMeter:
    """The board's cumulative energy counter, differenced around a region. ``sensor`` is injectable."""

    def __init__(self, sensor=None, device_index: int = 0):
        if sensor is None:
            from edgekit.power.sensors.nvml import NvmlSensor

            sensor = NvmlSensor(indices=[device_index])
        self.sensor = sensor
        first = sensor.read()
        self.available = first.energy_mj is not None
        self.reason = None if self.available else (first.reason or "the sensor has no energy counter")

    def read_mj(self) -> float | None:
        return self.sensor.read().energy_mj if self.available else None

    def measure(self, fn: Callable[[], T], device: torch.device) -> tuple[T, EnergyWindow | None, float]:
        """Run fn with the device drained at both ends: (result, energy window or None, seconds)."""
        sync(device)
        e0, t0 = self.read_mj(), time.perf_counter()
        out = fn()
        sync(device)
        t1, e1 = time.perf_counter(), self.read_mj()
        seconds = t1 - t0
        if e0 is None or e1 is None:
            return out, None, seconds
        return out, EnergyWindow(energy_mj=e1 - e0, seconds=seconds), seconds

    def close(self) -> None:
        self.sensor.close()


def device_info(device: torch.device) -> dict:
    import platform

    info: dict = {"type": device.type, "python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(name=p.name, sm_count=p.multi_processor_count, memory_bytes=p.total_memory,
                    capability=f"{p.major}.{p.minor}", l2_bytes=getattr(p, "L2_cache_size", None),
                    cuda=torch.version.cuda)
    else:
        info["name"] = platform.processor() or platform.machine()
    return info
