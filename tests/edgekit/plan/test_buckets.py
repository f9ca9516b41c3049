"""Bucket choice from a trace: optimal (checked by brute force), better than uniform, honest coverage."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgekit.errors import ConfigError
from edgekit.plan.buckets import Trace, choose_buckets, evaluate, load_trace, parse_bucket_list, uniform_buckets


def _trace(prompts, completions=None) -> Trace:
    p = np.asarray(prompts, dtype=np.int64)
    c = np.zeros_like(p) if completions is None else np.asarray(completions, dtype=np.int64)
    return Trace(p, c, "test")


def _brute_force_padding(trace: Trace, k: int, context: int) -> int:
    """Least padding over every set of at most k buckets drawn from the observed lengths (the longest always in)."""
    lengths = sorted(set(int(x) for x in trace.prompt_tokens))
    top = lengths[-1]
    best = None
    for r in range(0, k):
        for combo in itertools.combinations(lengths[:-1], r):
            pad = evaluate(tuple(combo) + (top,), trace, context, "bf").padding_tokens
            best = pad if best is None else min(best, pad)
    return best


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=25), st.integers(1, 4))
def test_chooser_is_optimal(prompts, k):
    trace = _trace(prompts)
    chosen = choose_buckets(trace, context=4096, max_buckets=k, align=1)
    assert len(chosen) <= k
    rep = evaluate(chosen, trace, 4096, "dp")
    assert rep.coverage == 1.0
    assert rep.padding_tokens == _brute_force_padding(trace, k, 4096)


def test_chooser_beats_uniform_on_a_skewed_trace():
    rng = np.random.default_rng(0)
    # Chat-like: most prompts short, a long tail of documents.
    prompts = np.concatenate([rng.integers(8, 120, 900), rng.integers(300, 600, 70), rng.integers(1500, 4000, 30)])
    completions = rng.integers(16, 256, len(prompts))
    trace = _trace(prompts, completions)
    best = evaluate(choose_buckets(trace, 8192, 6), trace, 8192, "dp")
    uni = evaluate(uniform_buckets(trace, 8192, 6), trace, 8192, "uniform")
    assert best.coverage == uni.coverage == 1.0
    assert best.waste < uni.waste / 2
    assert all(b % 16 == 0 for b in best.buckets)


def test_buckets_never_exceed_context_and_long_requests_are_uncovered():
    trace = _trace([100, 200, 900, 5000], [50, 50, 200, 10])
    chosen = choose_buckets(trace, context=1024, max_buckets=3)
    assert chosen[-1] <= 1024
    rep = evaluate(chosen, trace, 1024, "dp")
    # 900 + 200 > 1024 and 5000 > 1024: two of four requests cannot be served
    assert rep.covered == 2 and rep.coverage == 0.5 and rep.chunked == 0
    assert sum(rep.per_bucket) == rep.covered


def test_a_request_past_the_largest_bucket_that_fits_the_context_is_counted_as_chunked_not_covered():
    """The server prefills such a prompt eagerly in chunks of the largest bucket: served, but by no bucket."""
    rep = evaluate((64, 128), _trace([10, 100, 300, 1000], [10, 10, 10, 100]), 1024, "given")
    assert rep.covered == 2 and rep.chunked == 1 and rep.to_dict()["chunked"] == 1  # 1000 + 100 > 1024: neither


def test_waste_accounting():
    rep = evaluate((64, 128), _trace([10, 64, 100]), 1024, "given")
    assert rep.padded_tokens == 64 + 64 + 128 and rep.real_tokens == 174
    assert rep.waste == pytest.approx((256 - 174) / 256)


def test_trace_errors_name_the_line(tmp_path):
    p = tmp_path / "trace.jsonl"
    p.write_text(json.dumps({"prompt_tokens": 10, "completion_tokens": 5}) + "\n" + json.dumps({"prompt_tokens": "x"}) + "\n")
    with pytest.raises(ConfigError, match=r"line 2.*prompt_tokens"):
        load_trace(p)
    p.write_text("{not json\n")
    # the decoder's reason reads whole, with the column where it failed
    with pytest.raises(ConfigError, match=r"line 1: not JSON \(Expecting property name .* at column 2\)"):
        load_trace(p)
    p.write_text(json.dumps({"prompt_tokens": 10, "completion_tokens": 5, "ts": 1.5}) + "\n\n")
    assert len(load_trace(p)) == 1  # extra fields and blank lines are fine


def test_a_directory_as_trace_is_a_one_line_error(tmp_path):
    """`plan --trace .` gave an IsADirectoryError traceback."""
    with pytest.raises(ConfigError, match=r"is a directory, expected a JSONL file"):
        load_trace(tmp_path)


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux /proc")
def test_a_trace_that_cannot_be_read_is_a_one_line_error():
    """A file that exists but cannot be read gave an OSError traceback. /proc/self/mem opens and then fails its
    first read (EIO) for root too, where a chmod 000 file would not fail at all."""
    with pytest.raises(ConfigError, match=r"trace /proc/self/mem: cannot be read \(Input/output error\)"):
        load_trace("/proc/self/mem")


def test_a_trace_with_non_utf8_bytes_is_a_one_line_error_naming_the_line(tmp_path):
    """A trace with non-UTF-8 bytes gave a UnicodeDecodeError traceback."""
    p = tmp_path / "trace.jsonl"
    p.write_bytes(json.dumps({"prompt_tokens": 10, "completion_tokens": 5}).encode() + b"\n\xff\xfe{}\n")
    with pytest.raises(ConfigError, match=r"line 2: not UTF-8 text \(byte 0xff at column 1\)"):
        load_trace(p)


def test_parse_bucket_list():
    assert parse_bucket_list("64,128, 512") == (64, 128, 512)
    for bad in ("64,32", "a,b", "0,64", ""):
        with pytest.raises(ConfigError):
            parse_bucket_list(bad)


def test_trace_line_that_is_not_json_names_the_column_and_the_format(tmp_path):
    """The message ended mid-phrase ('not JSON (Invalid control character at)') and had no hint."""
    p = tmp_path / "t.jsonl"
    p.write_text('{"prompt_tokens": 5, "completion_tokens": 1}\n{"bad\n')
    with pytest.raises(ConfigError, match=r"line 2: not JSON \(Invalid control character at column 6\)") as e:
        load_trace(p)
    assert "prompt_tokens" in e.value.hint
