"""The H-weighted output error and the clip-ratio search that GPTQ and AWQ score candidates with."""

from __future__ import annotations

import torch

from edgekit.kernels.int4_layout import quantize_int4_rtn
from edgekit.quant.int4_rounding import CLIP_RATIOS, fake_quant, group_errors, output_error, rtn_record, search_clip


def test_output_error_equals_the_error_on_the_inputs():
    g = torch.Generator().manual_seed(0)
    x, e = torch.randn(300, 64, generator=g, dtype=torch.float64), torch.randn(10, 64, generator=g, dtype=torch.float64)
    assert abs(output_error(e, x.T @ x) - float((x @ e.T).pow(2).sum())) < 1e-6 * float((x @ e.T).pow(2).sum())
    # per-group errors are the same quantity with each group's own inputs
    ge = group_errors(e, x.T @ x, 32)
    assert torch.allclose(ge[:, 1], (x[:, 32:] @ e[:, 32:].T).pow(2).sum(0), rtol=1e-9)


def test_rtn_record_is_the_layouts_round_to_nearest():
    w = torch.randn(24, 128)
    for sym in (False, True):
        mine = rtn_record(w, None, 64, sym, torch.float16)
        q, s, m = quantize_int4_rtn(w, 64, symmetric=sym)
        assert torch.equal(mine.weight, q) and torch.equal(mine.scale, s)
        assert (m is None and mine.offset is None) or torch.equal(mine.offset, m)
        assert torch.equal(fake_quant(w, 64, sym, torch.float16), mine.dequantized())


def test_clip_search_clips_groups_with_an_outlier_and_never_does_worse_than_no_clip():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(32, 128, generator=g)
    w[:, 3] = 12.0  # one outlier per row in group 0: clipping it buys a finer grid for the other 31 weights
    x = torch.randn(500, 128, generator=g)
    h = x.T @ x
    clip = search_clip(w, h, 32, False, torch.float16)
    assert all(min(abs(c - r) for r in CLIP_RATIOS) < 1e-6 for c in clip.unique().tolist())
    assert float(clip[:, 0].mean()) < 1.0
    clipped = group_errors(w - fake_quant(w, 32, False, torch.float16, clip), h, 32)
    plain = group_errors(w - fake_quant(w, 32, False, torch.float16), h, 32)
    assert bool((clipped <= plain * (1 + 1e-6)).all()) and float(clipped.sum()) < float(plain.sum())
