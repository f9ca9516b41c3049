"""Static shape rules: bucket choice, padding, the over-length errors and opt-in truncation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgekit.errors import ShapeError
from edgekit.shapes import StaticShapes


@given(st.integers(min_value=1, max_value=2048))
@settings(max_examples=200, deadline=None)
def test_bucket_is_the_smallest_that_holds_the_prompt(n):
    shapes = StaticShapes()
    b = shapes.bucket_for(n)
    assert b >= n
    smaller = [x for x in shapes.buckets if x < b]
    assert all(x < n for x in smaller)


def test_prompt_longer_than_largest_bucket_is_refused_with_the_limit():
    shapes = StaticShapes(buckets=(16, 32), max_seq_len=64)
    with pytest.raises(ShapeError, match=r"40 tokens is too long: at most 32 fit.*largest bucket is 32.*--truncate"):
        shapes.fit_prompt(list(range(40)), max_new_tokens=8)


def test_prompt_plus_answer_longer_than_cache_is_refused():
    shapes = StaticShapes(buckets=(16, 32), max_seq_len=40)
    with pytest.raises(ShapeError, match=r"at most 20 fit.*KV cache holds 40 tokens and 20 are reserved"):
        shapes.fit_prompt(list(range(30)), max_new_tokens=20)


def test_truncate_keeps_the_last_tokens():
    shapes = StaticShapes(buckets=(16, 32), max_seq_len=64)
    ids, bucket = shapes.fit_prompt(list(range(40)), max_new_tokens=8, truncate=True)
    assert ids == list(range(8, 40)) and bucket == 32


def test_answer_longer_than_cache_is_refused():
    with pytest.raises(ShapeError, match="does not fit the KV cache"):
        StaticShapes(buckets=(16,), max_seq_len=16).fit_prompt([1], max_new_tokens=16)


def test_answer_longer_than_cache_names_a_count_that_fits_with_the_prompt():
    """The hint said 'at most 15 new tokens' for a 3-token prompt in a 16-token cache; 15 was then refused too."""
    shapes = StaticShapes(buckets=(16,), max_seq_len=16)
    with pytest.raises(ShapeError) as e:
        shapes.fit_prompt([1, 2, 3], max_new_tokens=20)
    assert e.value.hint == "ask for at most 13 new tokens (the prompt takes 3) or use a longer context"
    assert shapes.fit_prompt([1, 2, 3], max_new_tokens=13)[0] == [1, 2, 3]
    with pytest.raises(ShapeError) as e:  # --truncate may cut the prompt to one token
        shapes.fit_prompt([1, 2, 3], max_new_tokens=20, truncate=True)
    assert e.value.hint == "ask for at most 15 new tokens or use a longer context"


def test_empty_prompt_is_refused():
    with pytest.raises(ShapeError, match="empty"):
        StaticShapes().fit_prompt([], max_new_tokens=4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(buckets=(64, 32)), "strictly increasing"),
        (dict(buckets=(0, 32)), "positive"),
        (dict(buckets=(32, 4096), max_seq_len=2048), "exceeds the KV cache"),
        (dict(batch=0), "batch"),
    ],
)
def test_invalid_shape_sets_are_refused(kwargs, match):
    with pytest.raises(ShapeError, match=match):
        StaticShapes(**kwargs)


def test_for_context_caps_buckets_at_the_cache_length():
    s = StaticShapes.for_context(300)
    assert s.buckets[-1] == 300 and s.max_seq_len == 300
    assert StaticShapes.for_context(100).buckets == (32, 64, 100)
