"""On the GPU (issue 13): serve's graphed runner on the persistent decode path gives finite logits and the fused
path's greedy tokens, over a bundle whose fused operators are its signed plugins, as ``serve`` runs it.

The H200 run that found the bug (a persistent server: non-finite logits on most decode steps, one client, no swap)
differed from the passing persistent tests in: serve's GraphedRunner (not GraphedDecodeStep), a batch-8 cache
decoded at batch 1, four bucket graphs sharing one grid-barrier counter, the bundle's AOT head plugin instead of
the JIT head. The CPU test (test_persistent_serve_pattern.py) rules out the host logic and the staged kernel's
arithmetic for that pattern; ``test_which_factor_breaks_the_persistent_runner`` varies the GPU-only factors one at a
time, so its failing parameters name the difference.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
STEPS = 12


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from gpu_bundles import tiny_h200_bundle

    return tiny_h200_bundle(tmp_path_factory.mktemp("persistent-serve"))


def _runner(decoder, table, cache_batch: int, buckets: tuple[int, ...], prefer: str, max_seq: int = 96):
    from edgekit.runtime.step_runner import GraphedRunner

    cache = decoder.new_cache(cache_batch, max_seq)
    r = GraphedRunner(decoder, table, cache, buckets, (), baseline=table.sources(), prefer=prefer)
    assert r.decode_path.name == prefer, r.decode_path.reason
    return r


def _greedy(runner, batch: int) -> tuple[list[list[int]], int]:
    """STEPS synchronous steps of rows [0, batch) from positions 0 (each step writes the row it attends next):
    the greedy picks per step and the count of non-finite rows."""
    tokens, out, bad = [3 + r for r in range(batch)], [], 0
    for pos in range(STEPS):
        res = runner.step(batch, tokens, [pos] * batch)
        bad += sum(not f for f in res.finite)
        out.append(res.greedy)
        tokens = res.greedy
    return out, bad


@pytest.mark.parametrize("batch", [1, 2, 8])
def test_serves_persistent_runner_gives_the_fused_runners_tokens_with_finite_logits(bundle, batch):
    dec = bundle.decoder()
    fused = _runner(dec, dec.ops, 8, (1, 2, 4, 8), "fused")
    persistent = _runner(dec, dec.ops, 8, (1, 2, 4, 8), "persistent")
    want, bad_fused = _greedy(fused, batch)
    got, bad = _greedy(persistent, batch)
    assert bad_fused == 0 and bad == 0, (bad_fused, bad)
    assert got == want


@pytest.mark.parametrize("table", ["bundle plugins", "jit triton"])
@pytest.mark.parametrize("cache_batch,buckets,max_seq", [(1, (1,), 96), (8, (1,), 96), (8, (1, 2, 4, 8), 96),
                                                         (8, (1, 2, 4, 8), 1024)])
def test_which_factor_breaks_the_persistent_runner(bundle, table, cache_batch, buckets, max_seq):
    """Batch-1 persistent steps for each combination of: the head (bundle plugin / JIT), a cache larger than the
    decode batch, several bucket graphs sharing the decoder's grid-barrier counter, a long cache (many KV splits,
    most of them empty at these positions, as in serve's context). The failing ids name the cause."""
    from edgekit.kernels.triton_backend import triton_dispatch_table

    dec = bundle.decoder() if table == "bundle plugins" else bundle.decoder(triton_dispatch_table())
    want, _ = _greedy(_runner(dec, dec.ops, cache_batch, buckets, "fused", max_seq), 1)
    got, bad = _greedy(_runner(dec, dec.ops, cache_batch, buckets, "persistent", max_seq), 1)
    assert bad == 0, f"{bad} of {STEPS} persistent steps gave non-finite logits"
    assert got == want


def _reuse_freed_small_blocks() -> list:
    """Small device tensors full of non-zero values: they take whatever small blocks the caching allocator has free,
    e.g. device memory of a decode step that was freed while a graph still replays its address."""
    import gc

    import torch

    gc.collect()
    return [torch.full((128,), 7, dtype=torch.int32, device="cuda") for _ in range(2048)]


def test_a_runners_graphs_keep_their_decode_steps_device_memory(bundle):
    """The H200 bug behind serve's non-finite persistent logits: the graph outlived the PersistentDecoder it was
    captured from, whose grid-barrier counter went back to the allocator and was taken by a later tensor."""
    dec = bundle.decoder()
    want, _ = _greedy(_runner(dec, dec.ops, 8, (1, 2, 4, 8), "fused"), 1)
    persistent = _runner(dec, dec.ops, 8, (1, 2, 4, 8), "persistent")
    junk = _reuse_freed_small_blocks()
    got, bad = _greedy(persistent, 1)
    assert bad == 0, f"{bad} of {STEPS} persistent steps gave non-finite logits"
    assert got == want
    del junk


def test_runs_graphed_step_keeps_its_decode_steps_device_memory(bundle):
    """The same for `run`'s GraphedDecodeStep (run_generator keeps only the graphed step)."""
    from edgekit.generate import GenerationStats
    from edgekit.runtime.run_generator import run_generator

    prompt = [5, 6, 7, 8, 9]
    tokens = {}
    for path in ("fused", "persistent"):
        setup = run_generator(bundle, prompt, STEPS, prefer=path)
        assert setup.decode_path["path"] == path, setup.decode_path
        junk = _reuse_freed_small_blocks()
        tokens[path] = list(setup.generator.stream(prompt, STEPS, stop_ids=(), stats=GenerationStats()))
        del junk
    assert tokens["persistent"] == tokens["fused"]
