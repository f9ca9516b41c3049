"""Chunked prefill computes what the whole-prompt prefill computes: the same cache row and the same logits, for a
Llama-family model and for Gemma 3's sliding-window layers, whose ring of 4 rows a chunk wraps (tiny-gemma3: layers 0
and 1 local with a window of 4, layer 2 global)."""

from __future__ import annotations

from unittest.mock import patch

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgekit.model import chunked_prefill
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


def _attend_fp64(q, k, v, start, scale, window):
    """The chunk's attention in one softmax, FP64 (the oracle)."""
    _, Hq, C, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = Hq // Hkv
    kq, vq = k.double().repeat_interleave(G, dim=1), v.double().repeat_interleave(G, dim=1)  # (1, Hq, S, D)
    scores = (q.double() @ kq.transpose(-1, -2)) * scale  # (1, Hq, C, S)
    q_pos = start + torch.arange(C)[:, None]
    k_pos = start + C - S + torch.arange(S)[None, :]
    allowed = (k_pos <= q_pos) & ((q_pos - k_pos < window) if window else True)
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ vq


TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 2e-3}  # the output's rounding


@settings(max_examples=60, deadline=None)
@given(C=st.integers(1, 24), history=st.integers(0, 70), ahead=st.integers(0, 6),
       groups=st.sampled_from([(1, 1), (4, 2), (6, 1)]), window=st.sampled_from([0, 1, 3, 16]),
       keys=st.sampled_from([1, 7, 16, 512]), loud=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.float16]), seed=st.integers(0, 2**16))
def test_the_chunk_attention_in_key_blocks_matches_one_fp64_softmax(C, history, ahead, groups, window, keys, loud,
                                                                      dtype, seed):
    """attend_chunk's online softmax over ``keys`` keys at a time (1 to 512: one to ~90 steps; windows that hide whole
    blocks from some queries; a chunk at position 0) against one FP64 softmax. ``loud``: scores in the hundreds,
    which overflow exp in FP32 without the running max."""
    Hq, Hkv = groups
    g = torch.Generator().manual_seed(seed)
    S, D, start = history + C, 8, history + ahead  # keys of positions [start + C - S, start + C): history <= start
    q, k, v = (torch.randn(1, h, n, D, generator=g, dtype=torch.float64) for h, n in ((Hq, C), (Hkv, S), (Hkv, S)))
    q = q * (60 if loud else 1)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    with patch.object(chunked_prefill, "SCORE_ELEMENTS", keys * Hq * C):
        got = chunked_prefill.attend_chunk(q, k, v, start, 0.35, window)
    assert got.dtype == dtype and got.shape == (1, Hq, C, D)
    # scores in the hundreds carry FP32 rounding of ~3e-5 into the softmax's exponent: the oracle's own conditioning
    tol = 1e-4 if loud and dtype == torch.float32 else TOLERANCE[dtype]
    torch.testing.assert_close(got.double(), _attend_fp64(q, k, v, start, 0.35, window), rtol=tol, atol=tol)


@pytest.mark.parametrize("keys", [4, 9])
def test_a_prompt_in_chunks_fills_its_row_as_one_prefill_does_with_short_key_blocks(model, keys):
    """The whole-model check above with each chunk's attention taking ``keys`` keys a step (several steps a chunk)."""
    elements = keys * model.config.n_heads * 16  # chunks of 16 queries
    with patch.object(chunked_prefill, "SCORE_ELEMENTS", elements):
        test_a_prompt_in_chunks_fills_its_row_as_one_prefill_does(model, 16)
