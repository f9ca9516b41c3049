"""Where a GPU golden check runs (edgekit.runtime.gpu_runner.on_own_stream, plugin_checks.gpu_runner): on a CUDA
stream of its own, waiting for that stream only.

A check beside a serving process must neither queue behind the serving stream (the legacy default stream the
device thread replays its graphs on) nor synchronize the whole device: a device-wide synchronize while another
thread captures a graph fails ("operation not permitted when stream is capturing"), which on the H200 refused a
healthy plugin. There is no CUDA here, so torch's stream calls are replaced by a recorder that refuses the
legacy default stream and a device-wide synchronize; the plugin's kernel is the torch reference, run for real on
the check's real golden vectors. The GPU twin is test_golden_check_during_capture_gpu.py.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

import realpkg
from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.runtime import gpu_runner
from edgekit.runtime.plugin_checks import golden_checker, package_verifier
from edgekit.runtime.plugin_policy import SwapRefused

AUTHOR = realpkg.key(1)


class _Stream:
    """Stands in for torch.cuda.Stream: records which stream work ran on and whether it was waited for."""

    made: list["_Stream"] = []

    def __init__(self, device=None, priority=0):
        self.device, self.launched, self.synchronized = device, [], False
        _Stream.made.append(self)

    def synchronize(self):
        self.synchronized = True

    def wait_stream(self, other):
        raise AssertionError("the check waited for another stream (the caller's: the serving stream)")


class _Cuda:
    current: _Stream | None = None

    @staticmethod
    @contextmanager
    def stream(s):
        before, _Cuda.current = _Cuda.current, s
        try:
            yield
        finally:
            _Cuda.current = before

    @staticmethod
    def current_stream(device=None):
        raise AssertionError("the check touched the legacy default stream (the serving stream)")

    @staticmethod
    def synchronize(device=None):
        raise AssertionError("device-wide synchronize")


class _Op:
    """The plugin's kernel as launched: records the stream it went to; computes the reference."""

    def __init__(self):
        self.unloaded = False

    def __call__(self, x, weight, eps):
        assert _Cuda.current is not None, "launched outside the check's own stream"
        _Cuda.current.launched.append("rmsnorm")
        return rmsnorm_reference(x, weight, eps)

    def unload(self):
        self.unloaded = True


@pytest.fixture()
def fake_cuda(monkeypatch):
    _Stream.made.clear()
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", _Cuda.stream)
    monkeypatch.setattr(torch.cuda, "current_stream", _Cuda.current_stream)
    monkeypatch.setattr(torch.cuda, "synchronize", _Cuda.synchronize)
    op = _Op()
    monkeypatch.setattr(gpu_runner, "load_plugin_op", lambda meta, read, dev: op)
    return op


@pytest.fixture(scope="module")
def plugin():
    return package_verifier(realpkg.trusted(AUTHOR))(realpkg.pack(AUTHOR, 2))


def test_the_store_golden_check_runs_on_a_stream_of_its_own_and_waits_for_it_alone(fake_cuda, plugin):
    from edgekit.runtime.plugin_checks import gpu_runner as store_gpu_runner

    golden_checker(store_gpu_runner("cpu"))(plugin)  # passes: the reference is right on its own vectors
    launched = [s for s in _Stream.made if s.launched]
    assert launched, "no kernel ran"
    assert all(s.synchronized for s in launched)
    assert fake_cuda.unloaded


def test_a_wrong_kernel_is_still_refused_on_its_own_stream(fake_cuda, plugin, monkeypatch):
    from edgekit.runtime.plugin_checks import gpu_runner as store_gpu_runner

    monkeypatch.setattr(_Op, "__call__", lambda self, x, w, eps: rmsnorm_reference(x, w, 0.05))
    with pytest.raises(SwapRefused) as e:
        golden_checker(store_gpu_runner("cpu"))(plugin)
    assert e.value.reason == "golden_mismatch"
    assert "device-wide" not in str(e.value) and "legacy default" not in str(e.value)  # refused on its numbers


def test_outputs_come_back_on_the_host_after_the_stream_is_waited_for(fake_cuda):
    out = gpu_runner.on_own_stream(torch.device("cpu"), lambda: (torch.ones(2), {"y": torch.zeros(1)}, 3))
    (s,) = _Stream.made
    assert s.synchronized
    assert out[0].device.type == "cpu" and out[1]["y"].device.type == "cpu" and out[2] == 3
