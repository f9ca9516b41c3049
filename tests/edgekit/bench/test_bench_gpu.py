"""On the GPU: edgekit's runtime and the compiled baseline decode the reference path's tokens, and the run is whole."""

from __future__ import annotations

import pytest
import torch

from edgekit.bench.engines import CompiledReferenceEngine, RuntimeEngine, apply_inductor_flags
from edgekit.bench.measure import copy_bandwidth
from edgekit.bench.runner import BenchRun, BenchSettings, _cast, quantized, reference_tokens
from edgekit.model.presets import PRESETS
from edgekit.model.weights import random_weights

pytestmark = pytest.mark.gpu
TINY = PRESETS["tiny"]


def _setup(precision: str, T: int = 40):
    w = quantized(_cast(random_weights(TINY, seed=3), "cuda", torch.float16), precision)
    prompt = torch.randint(0, TINY.vocab_size, (1, T), generator=torch.Generator().manual_seed(4)).cuda()
    return w, prompt, reference_tokens(TINY, w, prompt, 9)


@pytest.mark.parametrize("precision", ["fp16", "int8", "int8-head"])
def test_runtime_engine_decodes_the_reference_tokens(precision):
    w, prompt, ref = _setup(precision)
    eng = RuntimeEngine(TINY, w, 128, 16)
    first = eng.prefill(prompt)
    assert [int(first[0])] + eng.decode(first, 40, 8).tolist() == ref
    assert int(eng.prefill_graphed(prompt)[0]) == ref[0]  # the graphed prefill picks the same first token
    assert [int(first[0])] + eng.decode(first, 40, 8).tolist() == ref  # a replayed loop starts over cleanly


def test_profile_splits_the_graphed_step_into_its_kernels():
    from edgekit.bench.profile import profile_decode

    w, prompt, _ = _setup("int8")
    eng = RuntimeEngine(TINY, w, 128, 16)
    p = profile_decode(eng, eng.prefill(prompt), 40, 16)
    # every block launches at least its norms, projections, attention and activation
    assert p["kernels_per_token"] >= 6 * TINY.n_layers
    assert 0 < p["kernel_ms_per_token"] <= 1.5 * p["wall_ms_per_token"]
    assert any("gemv" in k["name"] for k in p["top_kernels"])


@pytest.mark.parametrize("preset,precision", [("tiny", "fp16"), ("tiny-qwen3", "int8-head"),
                                               ("tiny-qwen3", "int4-head")])
def test_the_fused_step_launches_the_kernels_the_planner_counts(preset, precision):
    # what the profiler sees a graphed fused step launch is what the planner counted on meta tensors (its glue ops'
    # torch kernels included: a tied quantized table's lookup, tiny-qwen3's), plus the loop's feedback kernel; the
    # decode call's reset (a few copies) is spread over its 32 tokens. A planner that miscounts (an INT4 lookup once
    # counted as 1 kernel ran 8) fails it.
    from edgekit.bench.fused_engine import FusedRuntimeEngine
    from edgekit.bench.profile import profile_decode

    cfg = PRESETS[preset]
    w = quantized(_cast(random_weights(cfg, seed=3), "cuda", torch.float16), precision)
    prompt = torch.randint(0, cfg.vocab_size, (1, 40), generator=torch.Generator().manual_seed(4)).cuda()
    eng = FusedRuntimeEngine(cfg, w, 128, 32)
    p = profile_decode(eng, eng.prefill(prompt), 40, 32)
    assert round(p["kernels_per_token"]) == eng.path.launches_per_token + 1, p["top_kernels"]


def test_compiled_reference_engine_decodes_the_reference_tokens():
    apply_inductor_flags()
    w, prompt, ref = _setup("int8")
    eng = CompiledReferenceEngine(TINY, w, 128, 16)
    try:
        first = eng.prefill(prompt)
        for _ in range(3):  # warm-up, CUDA-graph recording, replay
            got = [int(first[0])] + eng.decode(first, 40, 8).tolist()
        assert got == ref
    finally:
        eng.close()


def test_copy_bandwidth_is_hbm_class():
    bw = copy_bandwidth(torch.device("cuda"), nbytes=1 << 30, repeats=3)
    assert bw["bytes_per_s"] > 5e11  # any HBM GPU streams faster than 0.5 TB/s


def test_whole_run_on_a_tiny_model_keeps_every_row():
    s = BenchSettings(models=["preset:tiny"], precisions=("fp16", "int8"), contexts=(32, 64), new_tokens=8, hf_new_tokens=4,
                      repeats=1, baselines=("hf-eager",), check_tokens=5)
    doc = BenchRun(s, log=lambda m: None).run()
    assert len(doc.rows) == 2 * 2 * 2 + 2  # (per-operator + fused) x precisions x contexts, hf-eager x precisions
    for r in doc.rows:
        assert r.status == "ok", r.error
        assert r.tokens_match, (r.engine, r.tokens, r.reference_tokens)
        assert r.peak_memory_bytes > 0 and r.roofline.tokens_per_s > 0
    assert {q.baseline for q in doc.ratios} == {"hf-eager"}
