"""Discrete NVIDIA GPUs through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Per GPU: board power (mW), the instantaneous power where the driver exposes it,
the energy counter (mJ since the driver loaded; difference it for the energy of
a run), utilisation and temperature. ``nvmlDeviceGetPowerUsage`` is a ~1 s
moving average on recent GPUs, so a step in load shows up as a ramp of about a
second; the instantaneous field follows faster.
"""

from __future__ import annotations

from edgekit.power.sample import PowerSample
from edgekit.power.sensors.base import Sensor


def _pynvml():
    import pynvml  # nvidia-ml-py; optional: absent means "unavailable", not an error

    return pynvml


class NvmlSensor(Sensor):
    name = "nvml"
    # NVML refreshes power every ~20-100 ms depending on the GPU; faster polls return the same value.
    min_interval_s = 0.02

    def __init__(self, indices: list[int] | None = None):
        self.indices = indices
        self._nv = None
        self._handles: list[tuple[int, object]] = []
        self._init_error: str | None = None

    def _ensure(self) -> bool:
        if self._nv is not None:
            return True
        if self._init_error is not None:
            return False
        try:
            nv = _pynvml()
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
            idx = self.indices if self.indices is not None else list(range(count))
            self._handles = [(i, nv.nvmlDeviceGetHandleByIndex(i)) for i in idx]
        except ImportError:
            self._init_error = "nvidia-ml-py (pynvml) is not installed"
            return False
        except Exception as e:  # noqa: BLE001 - pynvml.NVMLError and its many subclasses
            self._init_error = f"NVML unavailable: {e}"
            return False
        if not self._handles:
            self._init_error = "NVML found no GPU"
            return False
        self._nv = nv
        return True

    def available(self) -> bool:
        return self._ensure()

    def _read(self, t: float) -> PowerSample:
        if not self._ensure():
            return PowerSample.unavailable(self.name, self._init_error or "NVML unavailable", t)
        nv = self._nv
        rails: dict[str, float] = {}
        temps: dict[str, float] = {}
        energy_total: float | None = 0.0
        loads: list[float] = []
        bad: list[str] = []
        for i, h in self._handles:
            key = f"GPU{i}"
            try:
                rails[key] = float(nv.nvmlDeviceGetPowerUsage(h))  # mW, ~1 s average
            except nv.NVMLError:
                bad.append(key)
                continue
            inst = instant_power_mw(nv, h)
            if inst is not None:
                rails[f"{key}_instant"] = inst
            try:
                e = float(nv.nvmlDeviceGetTotalEnergyConsumption(h))  # mJ since driver load
                energy_total = None if energy_total is None else energy_total + e
            except nv.NVMLError:
                energy_total = None  # not supported on this GPU (pre-Volta)
            try:
                loads.append(float(nv.nvmlDeviceGetUtilizationRates(h).gpu))
            except nv.NVMLError:
                pass
            try:
                temps[key.lower()] = float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
            except nv.NVMLError:
                pass
        board = {k: v for k, v in rails.items() if not k.endswith("_instant")}
        if not board:
            return PowerSample.unavailable(self.name, f"NVML power not readable for {', '.join(bad)}", t)
        return PowerSample(
            t_s=t, source=self.name, rails_mw=rails, total_mw=sum(board.values()), total_source="nvml_power_usage",
            gpu_load_pct=sum(loads) / len(loads) if loads else None, temps_c=temps,
            energy_mj=energy_total, unreadable=bad,
        )

    def close(self) -> None:
        if self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down a library that is going away anyway
                pass
            self._nv = None

    def describe(self) -> str:
        if not self._ensure():
            return f"nvml (unavailable: {self._init_error})"
        names = []
        for i, h in self._handles:
            try:
                n = self._nv.nvmlDeviceGetName(h)
                names.append(f"GPU{i} {n.decode() if isinstance(n, bytes) else n}")
            except Exception:  # noqa: BLE001
                names.append(f"GPU{i}")
        return f"nvml ({', '.join(names)})"


def instant_power_mw(nv, handle) -> float | None:
    """The instantaneous board power in mW (NVML_FI_DEV_POWER_INSTANT), or None where unsupported."""
    field_id = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", None)
    if field_id is None:
        return None
    try:
        (fv,) = nv.nvmlDeviceGetFieldValues(handle, [field_id])
    except Exception:  # noqa: BLE001 - old drivers raise, some return an error code in the struct
        return None
    if getattr(fv, "nvmlReturn", 1) != 0:
        return None
    by_type = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}
    attr = by_type.get(getattr(fv, "valueType", 1), "uiVal")
    try:
        return float(getattr(fv.value, attr))
    except (AttributeError, TypeError, ValueError):
        return None
