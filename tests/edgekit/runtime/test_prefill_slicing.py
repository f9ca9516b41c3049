"""The long prompt's slices are sized in time: a slice and the decode step after it fit one chunk's time."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from edgekit.runtime.prefill_slicing import MARGIN, MIN_SLICE_TOKENS, PROBE_TOKENS, PrefillCost


def _law(f: float, a: float, b: float, start: int, n: int) -> float:
    """A forward's fixed cost f, a per token, b per token and position attended (the slice's mean position)."""
    return f + n * (a + b * (start + n / 2))


def _learnt(f: float, a: float, b: float) -> PrefillCost:
    """A cost model fed with forwards timed by ``_law``: whole prompts, a decode-sized batch, slices at depth."""
    cost = PrefillCost()
    for start, n in [(0, 64), (0, 4), (0, 32), (64, 64), (500, 32), (1200, 16), (0, 48), (1800, 8)]:
        cost.observe(start, n, _law(f, a, b, start, n))
    cost.bias = 1.0  # the law is exact: the early forwards' run-over (before the fit had them) is not drift
    return cost


def test_before_anything_is_measured_the_first_slice_is_a_short_probe():
    assert PrefillCost().slice_tokens(64, 0, 2046, 0.2) == PROBE_TOKENS
    assert PrefillCost().slice_tokens(64, 0, 5, 0.2) == 5


def test_the_law_of_the_observed_forwards_is_recovered():
    cost = _learnt(0.18, 4.6e-3, 7e-6)
    assert abs(cost.fixed_s - 0.18) < 1e-6 and abs(cost.token_s - 4.6e-3) < 1e-8 and abs(cost.depth_s - 7e-6) < 1e-10
    assert abs(cost.chunk_s(64) - _law(0.18, 4.6e-3, 7e-6, 0, 64)) < 1e-6


def test_a_noisy_fit_never_makes_a_coefficient_negative():
    cost = PrefillCost()
    cost.observe(0, 64, 5.0)  # the first forward (allocations, lazy set-up): not learnt from
    assert cost.token_s is None
    for start, n, s in [(0, 64, 0.40), (0, 8, 0.45), (100, 16, 0.30), (900, 16, 0.20)]:  # noise: dearer when shorter
        cost.observe(start, n, s)
        assert cost.fixed_s >= 0 and cost.token_s > 0 and cost.depth_s >= 0, cost


@settings(max_examples=200, deadline=None)
@given(f=st.floats(0, 0.3), a=st.floats(1e-4, 2e-2), b=st.floats(0, 2e-5), step_frac=st.floats(0, 0.8),
       start=st.integers(0, 4000), chunk=st.integers(8, 256))
def test_a_slice_and_the_step_after_it_fit_one_chunks_time_at_any_depth(f, a, b, step_frac, start, chunk):
    cost = _learnt(f, a, b)
    chunk_s = _law(f, a, b, 0, chunk)  # the true time of one chunk at a prompt's start
    step_s = step_frac * chunk_s
    n = cost.slice_tokens(chunk, start, 10_000, step_s)
    assert 1 <= n <= chunk
    if n > MIN_SLICE_TOKENS:  # a slice above the floor was chosen to fit; the floor lets a prompt advance regardless
        assert _law(f, a, b, start, n) + step_s <= MARGIN * chunk_s * (1 + 1e-6), (n, step_s, chunk_s)
        # and not needlessly small: one more token would not have fitted (or the chunk is whole)
        assert n == chunk or _law(f, a, b, start, n + 1) + step_s > MARGIN * chunk_s * (1 - 1e-6)


def test_deeper_slices_are_smaller_and_a_step_longer_than_a_chunk_still_lets_the_prompt_advance():
    cost = _learnt(0.02, 6e-3, 4e-6)
    sizes = [cost.slice_tokens(64, start, 10_000, 0.1) for start in (0, 500, 1000, 2000)]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1], sizes
    assert cost.slice_tokens(64, 1000, 10_000, 10.0) == MIN_SLICE_TOKENS
    assert cost.slice_tokens(64, 1000, 3, 10.0) == 3  # never past the prompt's end


def test_one_length_alone_tells_no_fixed_cost_from_a_tokens():
    cost = PrefillCost()
    cost.observe(0, 32, 0.32)
    cost.observe(0, 32, 0.32)
    assert cost.fixed_s == 0 and abs(cost.token_s - 0.01) < 1e-12


def test_forwards_running_over_the_fit_shrink_the_next_slices():
    cost = _learnt(0.02, 6e-3, 4e-6)
    before = cost.slice_tokens(64, 500, 10_000, 0.1)
    for _ in range(6):  # the CPU got busier: every forward takes 1.5x its prediction
        cost.observe(500, 32, 1.5 * cost.seconds(500, 32))
    assert cost.bias > 1.3
    assert cost.slice_tokens(64, 500, 10_000, 0.1) < before
