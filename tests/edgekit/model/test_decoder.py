"""The Decoder's RoPE tables: sized to the positions a run can reach (its cache), as the memory plan counts them,
not to every position the model was trained for; a larger cache later grows them without changing a number."""

from __future__ import annotations

import pytest
import torch

from edgekit.model.decoder import Decoder
from edgekit.model.presets import preset_config
from edgekit.model.weights import random_weights
from edgekit.plan.memory import workspace_bytes


def _decoder(preset: str) -> Decoder:
    cfg = preset_config(preset)
    return Decoder(cfg, random_weights(cfg, seed=3))


def _greedy(dec: Decoder, context: int, steps: int = 6) -> torch.Tensor:
    cache = dec.new_cache(1, context)
    prompt = torch.randint(3, dec.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(4))
    logits = [dec.prefill(prompt, torch.tensor([9]), cache)]
    pos = torch.tensor([9])
    for _ in range(steps):
        logits.append(dec.decode(logits[-1].argmax(-1), pos, cache))
        pos = pos + 1
    return torch.stack(logits)


def _table_bytes(dec: Decoder) -> int:
    return sum(t.nbytes for pair in dec._tables.values() for t in pair)


@pytest.mark.parametrize("preset", ["tiny", "tiny-gemma3"])  # one table; a global and a local one
def test_tables_cover_the_cache_and_match_the_memory_plan(preset):
    dec = _decoder(preset)
    logits = _greedy(dec, 32)
    assert {name: cos.shape[0] for name, (cos, _) in dec._tables.items()} == dict.fromkeys(dec._tables, 32)
    assert dec.config.max_position_len == 1024  # the trained length the tables used to take
    assert _table_bytes(dec) == workspace_bytes(dec.config, batch=1, context=32, decode_slots=0)

    whole = _decoder(preset)
    for name in whole.graph("prefill").rope:
        whole.rope_tables(name)  # every trained position, as before
    assert torch.equal(_greedy(whole, 32), logits)  # the same numbers from the shorter table


def test_a_larger_cache_grows_the_tables_and_keeps_the_outgrown_ones():
    dec = _decoder("tiny")
    _greedy(dec, 16)
    small = dec._tables["rope"]
    got = _greedy(dec, 64)
    assert dec._tables["rope"][0].shape[0] == 64
    assert any(old is small for old in dec._retired_tables)  # a graph captured with it may still read it
    assert torch.equal(got, _greedy(_decoder("tiny"), 64))
    _greedy(dec, 16)  # a smaller cache again reads the larger table
    assert dec._tables["rope"][0].shape[0] == 64 and len(dec._retired_tables) == 1
