"""Chunked prefill computes what the whole-prompt prefill computes: the same cache row and the same logits, for a
Llama-family model and for Gemma 3's sliding-window layers, whose ring of 4 rows a chunk wraps (tiny-gemma3: layers 0
and 1 local with a window of 4, layer 2 global)."""

from __future__ import annotations

import pytest
import torch

from edgekit.model.loader import load_model
from edgekit.model.chunked_prefill import prefill_chunk
from edgekit.runtime.step_runner import RowPrefillCache


@pytest.fixture(scope="module", params=["tiny", "tiny-gemma3"])
def model(request):
    return load_model(f"preset:{request.param}", seed=5)


@pytest.mark.parametrize("chunk", [1, 3, 7, 16, 40])
def test_a_prompt_in_chunks_fills_its_row_as_one_prefill_does(model, chunk):
    dec = model.decoder()
    T, slot = 40, 2
    prompt = torch.randint(0, model.config.vocab_size, (1, T), generator=torch.Generator().manual_seed(1))
    whole = dec.new_cache(4, 64)
    want = dec.prefill(prompt, torch.tensor([T]), RowPrefillCache(whole, torch.tensor([slot])))  # (1, V)
    chunked = dec.new_cache(4, 64)
    for start in range(0, T, chunk):
        got = prefill_chunk(dec, chunked, slot, prompt[:, start : start + chunk], start)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for layer in range(model.config.n_layers):  # a ring layer: its 4 rows, the prompt's last 4 positions at p % 4
        torch.testing.assert_close(chunked.k[layer][slot, :, :T], whole.k[layer][slot, :, :T], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(chunked.v[layer][slot, :, :T], whole.v[layer][slot, :, :T], rtol=1e-5, atol=1e-5)
        assert not chunked.k[layer][[0, 1, 3]].any()  # the other rows are untouched
