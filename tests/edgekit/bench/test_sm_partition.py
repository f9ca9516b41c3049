"""SM partitions without a GPU: which API is chosen, the SM count reported (the one CUDA gives, not the one asked
for), and every way there is no partition saying why. The GPU behaviour is test_sm_partition_gpu.py's."""

from __future__ import annotations

import pytest
import torch

from edgekit.bench import sm_partition as smp
from edgekit.bench.sm_partition import Partition, Unavailable, open_on, open_partition, split_sm_count


class _Sm:
    def __init__(self, n):
        self.smCount = n


class _Resource:
    def __init__(self, n):
        self.sm = _Sm(n)


class _Enum:
    CU_DEV_RESOURCE_TYPE_SM = "sm"
    CU_GREEN_CTX_DEFAULT_STREAM = 1
    CU_STREAM_NON_BLOCKING = 1


class FakeDriver:
    """cuda-python's driver module as far as sm_partition calls it: (CUresult, values...) tuples; the split rounds a
    request up to ``granularity`` as CUDA does on sm_90 (groups of 8)."""

    CUdevResourceType = CUgreenCtxCreate_flags = CUstream_flags = _Enum

    def __init__(self, device_sms=132, granularity=8, fail=None):
        self.device_sms, self.granularity, self.fail, self.calls = device_sms, granularity, fail, []

    def _r(self, name, *values):
        self.calls.append(name)
        return (700,) if self.fail == name else (0, *values)

    def cuInit(self, flags):
        return self._r("cuInit")

    def cuDeviceGet(self, i):
        return self._r("cuDeviceGet", f"dev{i}")

    def cuDeviceGetDevResource(self, dev, kind):
        return self._r("cuDeviceGetDevResource", _Resource(self.device_sms))

    def cuDevSmResourceSplitByCount(self, groups, whole, flags, min_count):
        got = -(-min_count // self.granularity) * self.granularity
        return self._r("cuDevSmResourceSplitByCount", [_Resource(got)], 1, _Resource(whole.sm.smCount - got))

    def cuDevResourceGenerateDesc(self, groups, n):
        return self._r("cuDevResourceGenerateDesc", "desc")

    def cuGreenCtxCreate(self, desc, dev, flags):
        return self._r("cuGreenCtxCreate", "green")

    def cuGreenCtxStreamCreate(self, green, flags, priority):
        return self._r("cuGreenCtxStreamCreate", 1234)

    def cuGreenCtxDestroy(self, green):
        return self._r("cuGreenCtxDestroy")

    def cuStreamDestroy(self, s):
        return self._r("cuStreamDestroy")


class _TorchGreenContext:
    made: list = []

    def __init__(self, num_sms, device_id):
        self.num_sms, self.device_id = num_sms, device_id

    @classmethod
    def create(cls, *, num_sms, device_id):
        ctx = cls(num_sms, device_id)
        cls.made.append(ctx)
        return ctx

    def Stream(self):
        return f"green stream of {self.num_sms}"


class FakeGreenContexts:
    """torch.cuda.green_contexts as 2.11 has it: create(num_sms=, device_id=) and Stream(), no SM count."""

    GreenContext = _TorchGreenContext


def test_without_a_cuda_device_the_reason_says_so():
    got = open_partition(8, torch.device("cpu"))
    assert isinstance(got, Unavailable) and got.requested_sms == 8
    assert "CUDA GPU" in got.reason and "cpu" in got.reason
    if not torch.cuda.is_available():
        got = open_partition(16, torch.device("cuda"))
        assert isinstance(got, Unavailable) and "no CUDA device" in got.reason


def test_a_partition_needs_at_least_one_sm():
    with pytest.raises(ValueError, match="at least 1 SM"):
        open_partition(0, torch.device("cpu"))


def test_torch_api_first_and_the_sm_count_is_the_one_cuda_rounds_to():
    part = open_on(12, 0, 132, torch.device("cuda"), FakeGreenContexts, FakeDriver(granularity=8))
    assert isinstance(part, Partition)
    assert part.api == smp.TORCH_API and part.stream == "green stream of 12"
    assert part.requested_sms == 12 and part.sm_count == 16 and part.launch_sms == 16  # what CUDA gave, not the ask
    assert "cuDevSmResourceSplitByCount" in part.sm_count_source
    assert part.handle is _TorchGreenContext.made[-1]  # the green context lives as long as the partition


def test_torch_without_cuda_python_still_partitions_but_says_the_count_is_unknown():
    part = open_on(8, 0, 132, torch.device("cuda"), FakeGreenContexts, "cuda-python is not installed (x)")
    assert isinstance(part, Partition) and part.sm_count is None and part.launch_sms == 8
    assert part.sm_count_source.startswith("unknown") and "cuda-python is not installed" in part.sm_count_source


def test_a_torch_without_green_context_streams_falls_back_and_both_reasons_are_kept():
    class NoStream:
        class GreenContext:
            @staticmethod
            def create(*, num_sms, device_id):
                return object()  # torch 2.10: create works, no Stream()

    got = open_on(8, 0, 132, torch.device("cuda"), NoStream, FakeDriver(fail="cuGreenCtxCreate"))
    assert isinstance(got, Unavailable)
    assert "has no Stream()" in got.reason and "cuGreenCtxCreate failed" in got.reason


def test_neither_api_gives_one_reason_per_api():
    got = open_on(8, 0, 132, torch.device("cuda"), "torch 2.13 was built without green-context support",
                  "cuda-python is not installed (No module named 'cuda')")
    assert isinstance(got, Unavailable)
    assert got.reason.startswith("no green context: ")
    assert "built without green-context support" in got.reason and "cuda-python is not installed" in got.reason


def test_a_failing_torch_create_is_reported_with_its_message():
    class Old:
        class GreenContext:
            @staticmethod
            def create(*, num_sms, device_id):
                raise RuntimeError("cuda driver too old to use green context!")

    got = open_on(8, 0, 132, torch.device("cuda"), Old, "cuda-python is not installed")
    assert isinstance(got, Unavailable) and "driver too old" in got.reason


def test_split_errors_name_the_driver_call():
    with pytest.raises(RuntimeError, match=r"cuDevSmResourceSplitByCount\(1 group, minCount 8\) failed"):
        split_sm_count(FakeDriver(fail="cuDevSmResourceSplitByCount"), 0, 8)
    dev, group, n = split_sm_count(FakeDriver(granularity=2), 0, 7)
    assert n == 8 and group.sm.smCount == 8


def test_the_local_torch_reports_why_it_cannot_partition_or_offers_the_api():
    gc = smp.torch_green_contexts()
    if isinstance(gc, str):  # a CPU build: the reason names torch's version
        assert torch.__version__ in gc
    else:
        assert hasattr(gc, "GreenContext")
