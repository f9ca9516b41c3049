"""The long prompt's slices are sized in time: a slice and the rest of its turn fit one chunk's time."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from edgekit.runtime.prefill_slicing import (
    GROW, MARGIN, MIN_SLICE_TOKENS, PROBE_TOKENS, SHRINK, PrefillCost, pace_floor,
)


def _law(f: float, a: float, b: float, start: int, n: int) -> float:
    """A forward's fixed cost f, a per token, b per token and position attended (the slice's mean position)."""
    return f + n * (a + b * (start + n / 2))


def _learnt(f: float, a: float) -> PrefillCost:
    """A cost model fed with forwards from a prompt's start (the first, a warm-up, is not learnt from)."""
    cost = PrefillCost()
    for n in (64, 64, 4, 32, 128, 48, 12):
        cost.observe(0, n, _law(f, a, 0, 0, n))
    return cost


def test_before_anything_is_measured_the_first_slice_is_a_short_probe():
    assert PrefillCost().slice_tokens(128, 2046, 0.2) == PROBE_TOKENS
    assert PrefillCost().slice_tokens(128, 5, 0.2) == 5


def test_the_line_of_forwards_from_a_prompts_start_is_recovered_and_slices_at_depth_do_not_bend_it():
    cost = _learnt(0.18, 4.6e-3)
    cost.observe(1500, 20, 3.0)  # a slice deep in a prompt pays for attention: not a forward from the start
    assert abs(cost.fixed_s - 0.18) < 1e-9 and abs(cost.token_s - 4.6e-3) < 1e-12
    assert abs(cost.chunk_s(128) - _law(0.18, 4.6e-3, 0, 0, 128)) < 1e-9


def test_the_first_forward_is_a_warm_up_and_one_length_alone_tells_no_fixed_cost():
    cost = PrefillCost()
    cost.observe(0, 32, 5.0)  # allocations, lazy set-up
    assert cost.token_s is None
    cost.observe(0, 32, 0.32)
    cost.observe(0, 32, 0.32)
    assert cost.fixed_s == 0 and abs(cost.token_s - 0.01) < 1e-12


def test_noise_never_makes_the_fixed_cost_negative():
    cost = PrefillCost()
    for n, s in [(64, 0.4), (64, 0.4), (8, 0.45), (16, 0.5)]:  # shorter took longer: noise
        cost.observe(0, n, s)
        assert cost.token_s is None or (cost.fixed_s >= 0 and cost.token_s > 0)


@settings(max_examples=200, deadline=None)
@given(f=st.floats(0, 0.3), a=st.floats(1e-4, 2e-2), depth=st.floats(0, 2e-3), rest_frac=st.floats(0, 0.6),
       chunk=st.integers(16, 256), prompt=st.integers(200, 4000))
def test_slices_of_a_whole_prompt_settle_within_one_chunks_time_at_every_depth(f, a, depth, rest_frac, chunk, prompt):
    """A prompt sliced under a law whose attention share grows with depth (up to doubling a token's cost every 500
    positions: the default model on a CPU went ~4x over 2000): after the first few slices (feedback needs one to learn
    from) each slice plus the rest of its turn stays within one chunk's time, bar the floor."""
    b = depth * a
    cost = _learnt(f, a)
    chunk_s = _law(f, a, 0, 0, chunk)
    rest = rest_frac * chunk_s
    done, last, turns = 0, None, []
    while done < prompt:
        n = cost.slice_tokens(chunk, prompt - done, rest, last)
        assert 1 <= n <= min(chunk, prompt - done)
        if last is not None and n < prompt - done:
            assert SHRINK * last[0] - 1 <= n <= max(GROW * last[0], MIN_SLICE_TOKENS)  # no lurch either way
        s = _law(f, a, b, done, n)
        turns.append((n, s + rest))
        done, last = done + n, (n, s)
    settled = turns[3:-1]  # the last slice is what remained
    over = [(n, t) for n, t in settled if n > MIN_SLICE_TOKENS and t > chunk_s * 1.02]
    assert not over, (over[:3], chunk_s)


def test_a_slice_that_ran_over_makes_the_next_smaller_and_one_that_ran_short_a_bigger_one():
    cost = _learnt(0.18, 4.6e-3)
    avail = MARGIN * cost.chunk_s(128) - 0.2
    assert cost.slice_tokens(128, 2000, 0.2, (40, 2 * avail)) == 20
    assert cost.slice_tokens(128, 2000, 0.2, (40, avail / 4)) == int(40 * GROW)
    assert cost.slice_tokens(128, 2000, 10.0, (40, 1.0)) == MIN_SLICE_TOKENS  # a turn slower than a chunk
    assert cost.slice_tokens(128, 3, 0.2, (40, avail / 4)) == 3  # never past the prompt's end


@settings(max_examples=300, deadline=None)
@given(remaining=st.integers(1, 8000), per_turn=st.floats(1e-3, 1.0), token=st.floats(1e-5, 1e-2),
       due=st.floats(0.1, 600))
def test_the_pace_floor_is_the_fewest_tokens_per_slice_that_meet_the_due_time(remaining, per_turn, token, due):
    n = pace_floor(remaining, per_turn, token, due)
    assert 1 <= n <= remaining

    def total(k: int) -> float:  # k tokens a slice: ceil(remaining / k) turns, each paying per_turn
        return -(-remaining // k) * per_turn + remaining * token

    if total(remaining) > due:  # not even one forward meets it: all of it now (the engine caps it at a chunk)
        assert n == remaining
    else:
        assert total(n) <= due * (1 + 1e-9)
        assert n == 1 or total(n - 1) > due * (1 - 1e-9)


def test_no_due_time_means_no_floor():
    assert pace_floor(2046, 0.5, 5e-3, None) == 0 and pace_floor(0, 0.5, 5e-3, 10.0) == 0


@settings(max_examples=150, deadline=None)
@given(f=st.floats(0.05, 0.3), a=st.floats(1e-3, 1e-2), rest_frac=st.floats(0.35, 2.0), prompt=st.integers(500, 4000),
       share=st.floats(0.3, 0.9))
def test_under_turns_slower_than_a_slice_fits_a_prompt_still_comes_in_by_its_due_time(f, a, rest_frac, prompt, share):
    """The 2-core CPU's case: a forward's fixed cost f is most of a chunk, and the rest of a turn (4 rows' decode
    step) leaves no room for it in the chunk's time, so slicing for the streams alone falls to the 4-token floor and
    pays f prompt / 4 times. With a due time that chunk-sized slices could meet, the slices meet it (the pace is
    re-judged every slice, from a token's cost at the last slice's depth)."""
    chunk = 128
    cost = _learnt(f, a)
    rest = rest_frac * cost.chunk_s(chunk)

    def run(due: float | None) -> float:
        done, last, clock = 0, None, 0.0
        while done < prompt:
            n = cost.slice_tokens(chunk, prompt - done, rest, last, None if due is None else due - clock)
            s = _law(f, a, 0, done, n)
            clock += s + rest
            done, last = done + n, (n, s)
        return clock

    whole_chunks = -(-prompt // chunk) * (f + rest) + prompt * a  # the fastest slicing at most a chunk
    due = whole_chunks / share
    assert run(None) > due or rest_frac < MARGIN  # without a due time the prompt would be late
    assert run(due) <= due * (1 + 1e-9)


def test_one_slow_small_slice_does_not_jump_the_prompt_to_whole_chunks():
    """A 4-token slice is mostly a forward's fixed cost: one that ran slow (0.6 s against ~0.2) reads as a token 20x
    dearer than it is, and the pace for the rest of a 2000-token prompt due in 150 s would be every token at once.
    The pace grows by at most GROW a slice and is judged again on the next one."""
    cost = _learnt(0.18, 4.6e-3)
    assert cost.slice_tokens(128, 2000, 0.3, (4, 0.6), 150.0) == int(GROW * 4)
    assert cost.slice_tokens(128, 2000, 0.3, (4, 0.6), None) == MIN_SLICE_TOKENS  # no due time: the fairness size
