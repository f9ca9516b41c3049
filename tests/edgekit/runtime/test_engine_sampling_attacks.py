"""#32 rows 1 and 10: a temperature or top_p inside the accepted range that overflows the sampler.

Before: logits / 1e-37 overflowed to inf, softmax gave NaN and torch.multinomial raised inside the shared decode
step, which failed every request of the batch (HTTP 500 for all four); temperature <= 4e-38 or top_p 1e-300 failed
their own request with a 500. Now: sampling works relative to the row's best logit in float32, is greedy below a
temperature floor, and top_p always keeps the most likely token; a row that still cannot be sampled fails alone."""

from __future__ import annotations

import pytest
import torch

from edgekit.generate import SamplingConfig, _pick
from edgekit.model.loader import load_model
from edgekit.runtime.engine import Engine
from edgekit.shapes import StaticShapes

SHAPES = StaticShapes(buckets=(16, 32), max_seq_len=64)
PROMPTS = ([3, 4, 5], [7, 8, 9, 10], [1, 2])


@pytest.fixture(scope="module")
def model():
    return load_model("preset:tiny", seed=5)


@pytest.fixture()
def engine(model):
    e = Engine(model.decoder(), None, SHAPES, max_waiting=4)
    yield e
    e.close()


def test_temperature_1e_37_among_three_decoding_streams_fails_no_one(smol_engine):
    """The real model: its logits reach the 30s, so logits / 1e-37 overflow float32 (the tiny preset's do not)."""
    prompt = smol_engine.encode(prompt="The capital of France is")
    greedy = [smol_engine.submit(p, 12, stop_ids=()) for p in ([1, 2, 3], [7, 8, 9, 10], prompt[:3])]
    tiny = smol_engine.submit(prompt, 12, SamplingConfig(temperature=1e-37, seed=3), stop_ids=())
    for job in [*greedy, tiny]:
        assert job.done.wait(120) and job.error is None, job.error
        assert len(job.tokens) == 12
    alone = smol_engine.submit(prompt, 12, stop_ids=())
    assert alone.done.wait(120) and alone.tokens == tiny.tokens  # a temperature that small is greedy


@pytest.mark.parametrize("temperature, top_p", [(1e-37, 1.0), (4e-38, 1.0), (1e-45, 1.0), (5e-324, 1.0),
                                                (0.7, 1e-300), (1e-37, 1e-300), (2.0, 5e-324)])
def test_extreme_in_range_sampling_values_pick_the_best_token(temperature, top_p):
    logits = torch.tensor([[5.0, 40.0, -20.0, 39.99, float("-inf")]])  # the range of a real model's logits
    gen = torch.Generator().manual_seed(0)
    picks = {int(_pick(logits, SamplingConfig(temperature, 0, 0, top_p), gen)[0]) for _ in range(20)}
    assert picks == {1}


def test_a_row_that_cannot_be_sampled_fails_alone(engine, monkeypatch):
    """Whatever else makes one row's sampling raise, the other rows of the step keep decoding."""
    import edgekit.runtime.engine as engine_mod

    real = engine_mod._pick

    def pick(logits, sampling, gen):
        if sampling.seed == 666 and gen is not None and sampling.temperature > 0:
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        return real(logits, sampling, gen)

    monkeypatch.setattr(engine_mod, "_pick", pick)
    others = [engine.submit(p, 12, stop_ids=()) for p in PROMPTS]
    bad = engine.submit([5, 6, 7], 12, SamplingConfig(temperature=0.8, seed=666), stop_ids=())
    assert bad.done.wait(60) and bad.error is not None and "sampling" in str(bad.error)
    for job in others:
        assert job.done.wait(60) and job.error is None and len(job.tokens) == 12, job.error
