"""The runner interface: a launch fed from the device's own picks is the step the host would have launched."""

from __future__ import annotations

import pytest
import torch

from edgekit.model.loader import load_model
from edgekit.runtime.step_runner import EagerRunner


@pytest.fixture(scope="module")
def decoder():
    return load_model("preset:tiny", seed=5).decoder()


def _prefilled(decoder, prompts):
    cache = decoder.new_cache(4, 64)
    runner = EagerRunner(decoder, decoder.ops, cache, (1, 2, 4))
    firsts = []
    for slot, p in enumerate(prompts):
        tokens = torch.tensor([p + [0] * (16 - len(p))])  # (1, 16)
        firsts.append(int(runner.prefill(slot, tokens, torch.tensor([len(p)])).argmax(-1)))
    return runner, firsts


def test_fed_back_steps_match_host_fed_steps_and_leave_inactive_rows_alone(decoder):
    prompts = [[3, 4, 5], [7, 8, 9, 10, 11], [1]]
    active = [1, 0, 1, 0]  # row 1 is free (pad at position 0), row 3 is past the occupied rows
    want = []
    runner, firsts = _prefilled(decoder, prompts)
    tokens, positions = [firsts[0], 0, firsts[2], 0], [3, 0, 1, 0]
    for _ in range(6):  # the synchronous path: the host feeds every step
        step = runner.step(4, tokens, positions, active)
        want.append([step.greedy[i] for i in (0, 2)])
        tokens = [step.greedy[i] if a else tokens[i] for i, a in enumerate(active)]
        positions = [p + a for p, a in zip(positions, active)]

    runner, firsts = _prefilled(decoder, prompts)
    launches = [runner.launch(4, [firsts[0], 0, firsts[2], 0], [3, 0, 1, 0], active)]
    got = []
    for _ in range(5):  # launch t+1 from the device's picks before reading t
        launches.append(runner.launch(4))
        step = runner.collect(launches.pop(0))
        got.append([step.greedy[i] for i in (0, 2)])
    last = runner.collect(launches.pop(0))
    got.append([last.greedy[i] for i in (0, 2)])
    assert got == want
    inputs = runner._inputs[4]  # (3, b): the free rows still hold their pad at position 0
    assert inputs[0, 1] == 0 and inputs[1, 1] == 0 and inputs[1, 3] == 0 and inputs[1, 0] == 3 + 6


def test_a_fed_back_launch_needs_a_launch_of_its_bucket_first(decoder):
    runner, firsts = _prefilled(decoder, [[3, 4, 5]])
    with pytest.raises(RuntimeError, match="bucket 1"):
        runner.launch(1)
    first = runner.launch(2, [firsts[0], 0], [3, 0], [1, 0])
    with pytest.raises(RuntimeError, match="bucket 1"):
        runner.launch(1)
    with pytest.raises(RuntimeError, match="in flight"):  # the host's values would race the step in flight
        runner.launch(2, [firsts[0], 0], [3, 0], [1, 0])
    runner.collect(first)
    runner.collect(runner.launch(2))
