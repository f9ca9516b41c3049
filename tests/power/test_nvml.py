"""The NVML sensor: unavailable (not an error) without a GPU; follows a real load on one."""

from __future__ import annotations

import time

import pytest

from edgekit.power.sensors.nvml import NvmlSensor


def _has_nvml() -> bool:
    s = NvmlSensor()
    ok = s.available()
    s.close()
    return ok


def test_without_nvml_the_sensor_is_unavailable_and_never_raises():
    if _has_nvml():
        pytest.skip("this machine has NVML; the GPU test covers it")
    s = NvmlSensor()
    sample = s.read(1.0)
    assert not sample.available
    assert "NVML" in sample.reason or "pynvml" in sample.reason
    assert s.describe().startswith("nvml (unavailable")
    s.close()
    s.close()  # twice is fine


@pytest.mark.gpu
def test_nvml_sensor_follows_a_matmul_load():
    import torch

    s = NvmlSensor([0])
    idle = s.read()
    assert idle.available, idle.reason
    assert idle.total_mw > 10_000  # any datacentre GPU draws more than 10 W idle
    assert idle.energy_mj is not None and idle.temps_c["gpu0"] > 0
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)  # (n, n)
    peak = idle.total_mw
    peak_inst = idle.rails_mw.get("GPU0_instant", 0.0)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3.0:  # the 1 s averaged reading needs >1 s to ramp
        for _ in range(8):
            a @ a
        torch.cuda.synchronize()
        r = s.read()
        peak = max(peak, r.total_mw)
        peak_inst = max(peak_inst, r.rails_mw.get("GPU0_instant", 0.0))
    busy = s.read()
    s.close()
    assert busy.energy_mj > idle.energy_mj  # the counter integrates
    mean_w = (busy.energy_mj - idle.energy_mj) / 1000.0 / (busy.t_s - idle.t_s)
    print(f"idle {idle.total_mw / 1000:.0f} W, peak {peak / 1000:.0f} W (instant {peak_inst / 1000:.0f} W), mean from counter {mean_w:.0f} W (measured on GPU)")
    assert peak - idle.total_mw > 50_000  # a step of more than 50 W under fp16 matmuls
    assert mean_w > idle.total_mw / 1000.0  # the energy counter saw the load too
