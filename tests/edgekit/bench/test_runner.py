"""edgekit/bench/runner.py's transformers rows: the decode time is generate(n + 1) - generate(1), so a few noisy
calls on a busy CPU can invert it; the row is timed again before it is called failed, and fails only if the
medians of every call still say the decode took no time."""

from __future__ import annotations

import time

import pytest
import torch

from edgekit.bench.document import Row
from edgekit.bench.runner import EXTRA_ROUNDS, BenchSettings, measure_generate


class _ScriptedEngine:
    """generate(prompt, k) sleeps as scripted: ``first_calls`` of one token (after the warm-up) take ``slow_s``."""

    name, compiled, device = "hf-eager", False, torch.device("cpu")

    def __init__(self, slow_calls: int, slow_s: float = 0.03, one_s: float = 0.001, full_s: float = 0.01):
        self.slow_calls, self.slow_s, self.one_s, self.full_s = slow_calls, slow_s, one_s, full_s
        self.warm, self.timed_one = 2, 0

    def generate(self, prompt, k):
        if self.warm:  # the warm-up's two calls (n + 1, then 1) are not timed
            self.warm -= 1
        elif k == 1:
            self.timed_one += 1
            time.sleep(self.slow_s if self.timed_one <= self.slow_calls else self.one_s)
            return torch.zeros(1, dtype=torch.long)
        else:
            time.sleep(self.full_s)
        return torch.zeros(k, dtype=torch.long)


def _row() -> Row:
    return Row(model="preset:tiny", precision="fp16", engine="hf-eager", engine_label="transformers", context=16)


def _settings() -> BenchSettings:
    return BenchSettings(models=["preset:tiny"], repeats=1, hf_new_tokens=4, device="cpu")


def test_an_inverted_first_timing_is_timed_again_and_the_row_measured():
    row = _row()
    measure_generate(_ScriptedEngine(slow_calls=1), torch.zeros(1, 8, dtype=torch.long), _settings(), None, row)
    # round 1: 30 ms for one token against 10 ms for five; round 2's medians (15.5 ms against 10) still inverted;
    # round 3's (1 ms against 10) are not
    assert len(row.prefill_s_repeats) == len(row.decode_s_repeats) == 3
    assert row.decode_tokens_per_s > 0 and row.decode_ms_per_token == pytest.approx(1000 * (
        sorted(row.decode_s_repeats)[1] - sorted(row.prefill_s_repeats)[1]) / 4)


def test_a_decode_that_never_takes_time_still_fails_its_row_with_the_medians():
    row = _row()
    with pytest.raises(RuntimeError, match=f"was not slower than of 1 .* medians of {1 + EXTRA_ROUNDS} calls each"):
        measure_generate(_ScriptedEngine(slow_calls=10 ** 6), torch.zeros(1, 8, dtype=torch.long), _settings(), None,
                         row)


def test_a_first_timing_in_order_is_not_repeated():
    row = _row()
    measure_generate(_ScriptedEngine(slow_calls=0), torch.zeros(1, 8, dtype=torch.long), _settings(), None, row)
    assert len(row.prefill_s_repeats) == len(row.decode_s_repeats) == 1
