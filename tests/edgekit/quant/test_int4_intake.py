"""compare_lossless_int4 (eval --precision int4): the 4-bit intake against its dequantized twin."""

from __future__ import annotations

from dataclasses import replace

import torch

from edgekit.quant.gate import EvalText, GateConfig
from edgekit.quant.int4_intake import compare_lossless_int4

from .test_int4_calibration import _with_int4_blocks  # noqa: TID252


def _pair(tiny):
    fp = tiny.weights.to(dtype=torch.float32)
    return replace(tiny, weights=fp), replace(tiny, weights=_with_int4_blocks(fp, range(tiny.config.n_layers)))


def test_no_prompts_skips_the_greedy_check_as_the_other_eval_path_does(tiny):
    """eval --precision int4 --prompts 0 died in greedy_batch (max() of an empty sequence); --prompts allows 0."""
    dequantized, lossless = _pair(tiny)
    windows = [torch.randint(0, tiny.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))]
    res = compare_lossless_int4(dequantized, lossless, EvalText(windows, []), GateConfig(new_tokens=4))
    assert res["greedy_tokens_identical"] is None and res["greedy_tokens_total"] == 0
    assert res["greedy_agreement"] is None and res["tokens_scored"] == 31  # the perplexity part still ran
    res = compare_lossless_int4(dequantized, lossless, EvalText(windows, [[1, 2, 3]]), GateConfig(new_tokens=4))
    assert res["greedy_tokens_total"] == 4 and isinstance(res["greedy_tokens_identical"], bool)
