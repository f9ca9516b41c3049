"""On the GPU: a green context of 8 SMs really confines work. A compute-bound Triton kernel launched into it, eagerly
and as a CUDA graph captured and replayed the way the decode step is (edgekit.runtime.gpu_admin_lock pinned to the
partition's stream), runs several times slower than on the whole device; the SM count CUDA gave is reported and a
probe grid sees no more SMs than that. Then the bench's --sms rows on a tiny model, end to end.

Skipped only where neither torch nor cuda-python offers the API at all; an API that is there but fails, fails."""

from __future__ import annotations

import statistics

import pytest
import torch
import triton
import triton.language as tl

from edgekit.bench.sm_partition import (
    Partition, Unavailable, confined, driver_module, open_partition, seen_sms, torch_green_contexts,
)

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
ROUNDS, BLOCK = 8192, 1024  # dependent FMAs an element, elements a program: ~0.3 ms over the whole H200


@triton.jit
def _fma_kernel(out_ptr, ROUNDS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = offs.to(tl.float32)
    for _ in range(ROUNDS):  # compute-bound: no memory traffic until the one store
        x = x * 1.0000001 + 0.5
    tl.store(out_ptr + offs, x)


def _partition(n: int) -> Partition:
    part = open_partition(n, DEV)
    if isinstance(part, Unavailable):
        no_api = isinstance(torch_green_contexts(), str) and isinstance(driver_module(), str)
        if no_api:
            pytest.skip(f"no green-context API here: {part.reason}")
        pytest.fail(f"a green-context API is here but gave no partition: {part.reason}")
    return part


def _median_ms(fn, reps: int = 5) -> float:
    fn()  # warm-up: Triton's JIT, first launch
    torch.cuda.current_stream().synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _grid() -> int:
    return 8 * torch.cuda.get_device_properties(DEV).multi_processor_count  # 8 programs an SM of the whole device


def test_a_compute_bound_kernel_in_8_sms_is_much_slower_than_on_the_whole_gpu():
    part = _partition(8)
    try:
        device_sms = part.device_sms
        assert part.sm_count is not None, part.sm_count_source
        assert 8 <= part.sm_count < device_sms  # what CUDA gave (a multiple of its granularity), reported as such
        out = torch.empty(_grid() * BLOCK, device=DEV)

        def run():
            _fma_kernel[(_grid(),)](out, ROUNDS=ROUNDS, BLOCK=BLOCK, num_warps=4)

        whole = _median_ms(run)
        with confined(part, part.launch_sms):
            inside = _median_ms(run)
        # 8 of 132 SMs: ~16x the time if confined; 4x leaves room for clocks and tail effects, none for a no-op
        assert inside > 4 * whole, (inside, whole, part)
        seen = seen_sms(part, DEV)
        assert 1 <= len(seen) <= part.sm_count, seen  # a probe grid never reaches an SM outside the partition
        everywhere = _seen_whole()
        assert len(everywhere) > part.sm_count, everywhere  # the same probe on the whole device sees more
    finally:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        part.close()


def _seen_whole() -> list[int]:
    from edgekit.bench.sm_probe import seen_sms as probe

    return probe(DEV, torch.cuda.get_device_properties(DEV).multi_processor_count)


def test_a_graph_captured_and_replayed_in_the_partition_stays_confined():
    """The decode step's path: warm-up on side_stream(), capture_graph() without a stream, replay on the current
    stream, all pinned to the partition's stream by ``confined``."""
    from edgekit.runtime.gpu_admin_lock import capture_graph, side_stream

    part = _partition(8)
    try:
        out = torch.empty(_grid() * BLOCK, device=DEV)

        def captured() -> torch.cuda.CUDAGraph:
            side = side_stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                _fma_kernel[(_grid(),)](out, ROUNDS=ROUNDS, BLOCK=BLOCK, num_warps=4)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with capture_graph(g):
                _fma_kernel[(_grid(),)](out, ROUNDS=ROUNDS, BLOCK=BLOCK, num_warps=4)
            return g

        g_whole = captured()
        whole = _median_ms(g_whole.replay)
        with confined(part, part.launch_sms):
            assert side_stream().cuda_stream == part.stream.cuda_stream  # the warm-up runs in the partition
            g_inside = captured()
            inside = _median_ms(g_inside.replay)
            expect = out.clone()
        assert inside > 4 * whole, (inside, whole)
        g_whole.replay()  # the same kernel, the same result, whichever SMs ran it
        torch.cuda.synchronize()
        assert torch.equal(out, expect)
        del g_whole, g_inside
    finally:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        part.close()


def test_bench_rows_confined_to_8_sms_on_a_tiny_model():
    from edgekit.bench.document import PARTITION_ENGINE, TILE_CANDIDATES
    from edgekit.bench.runner import BenchRun, BenchSettings

    _partition(8).close()  # skip / fail as above before the run
    s = BenchSettings(models=["preset:tiny"], precisions=("fp16",), contexts=(40,), new_tokens=8, hf_new_tokens=4,
                      repeats=1, baselines=(), check_tokens=5, energy=False, profile=False, prefill_graph=False, sms=(8,))
    doc = BenchRun(s, log=lambda m: None).run()
    rows = [r for r in doc.rows if r.engine == PARTITION_ENGINE]
    assert {r.partition.tiles for r in rows} == set(TILE_CANDIDATES)
    for r in rows:
        assert r.status == "ok", r.error
        assert r.tokens_match, (r.partition.tiles, r.tokens, r.reference_tokens)
        p = r.partition
        assert p.confined and p.sm_count is not None and 8 <= p.sm_count < p.device_sms
        assert 1 <= p.observed_sms <= p.sm_count
        # the partition's own copy, below the whole device's (8 SMs cannot pull HBM's full bandwidth)
        assert 0 < p.copy_bytes_per_s < p.copy_bandwidth["kernel_whole_device"]["bytes_per_s"]
        assert r.roofline is not None and r.roofline.fraction > 0
        assert p.tile_choices and all("[" in label for label in p.tile_choices.values())
        assert p.launch_rule_sms == (p.device_sms if p.tiles.endswith("@device-sms") else p.sm_count)
    (q,) = doc.sm_partitions
    assert q.best in TILE_CANDIDATES and q.orin_plan_vs_best is not None and q.orin_tiles
    assert q.whole_device_tokens_per_s  # the same run's edgekit-fused row
