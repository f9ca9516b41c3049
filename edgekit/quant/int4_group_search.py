"""Group scales and offsets searched for the smallest output error: candidates, then a least-squares refit.

Round-to-nearest takes a group's scale and offset from its min and max, and
AWQ's clip search (edgekit.quant.int4_rounding.search_clip) only shrinks that
range symmetrically. Neither is the best grid for a group: the weights in
the middle of the range are many, the extremes few. Here every (row, group)
picks, by the error it causes on the layer's calibration inputs (the group's
block of H = X^T X, edgekit.quant.int4_rounding.group_errors), among:

1. the min-max parameters for every clip ratio in CLIP_RATIOS (so the result
   never scores worse than round-to-nearest or AWQ's clip);
2. asymmetric only: a grid of scales (SCALE_RATIOS of the min-max scale)
   times offsets moved by OFFSET_SHIFTS steps around the centred position;
3. each 32-element sub-block's own grid, moved by SUBBLOCK_SHIFTS steps: a
   GGUF Q4_0/Q4_1 source stores its weights on one grid per sub-block
   (w = q * d + m), which that sub-block's parameters reproduce bit for bit;
   across a group of 64/128 the sub-blocks' grids differ (SmolLM2's Q4_1 file:
   adjacent scales differ by ~1.2x), so this keeps one sub-block exact and
   rounds the others onto its grid;

and then refits: with the codes fixed, the scale and offset that minimise the
group's error are a 2x2 least-squares problem under H_gg; the codes are
rounded again against the refitted values, and a refit is kept only where it
lowers the error (REFITS rounds).

Measured on SmolLM2-135M's Q4_1 weights (plain squared error relative to
round-to-nearest; blocks.3.wqkv at G = 64, blocks.10.w_down at G = 128):
clip search 0.84 / 0.86, + the sub-block grids (shifted) 0.74 / 0.79, + the
scale x offset grid 0.71 / 0.76, + the refit 0.67 / 0.74. A dense scale x
offset grid alone (273 candidates) reaches 0.685 on wqkv and adding the
sub-block grids to it 0.684: at G = 64/128 the source's own grid is not
representable (adjacent Q4_1 scales differ by ~1.2x), and a good fit of the
whole group matters more than reproducing one sub-block.
"""

from __future__ import annotations

from typing import Iterator

import torch

from edgekit.kernels.int4_layout import Q_MAX, SUBBLOCK, SYMMETRIC_ZERO, int4_codes, int4_group_params
from edgekit.quant.int4_rounding import CLIP_RATIOS, group_errors, snap

SCALE_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8)
OFFSET_SHIFTS = (-0.5, -0.25, 0.0, 0.25, 0.5)  # in steps of the candidate scale
SUBBLOCK_SHIFTS = (-2, -1, 0, 1, 2)
REFITS = 4

Params = tuple[torch.Tensor, torch.Tensor | None]  # scale, offset or None: (N, K/G) FP32 holding stored values


def _stored(t: torch.Tensor, scale_dtype: torch.dtype) -> torch.Tensor:
    return t.to(scale_dtype).to(torch.float32)


def _candidates(wg: torch.Tensor, symmetric: bool, scale_dtype: torch.dtype) -> Iterator[Params]:
    """Candidate parameters for groups wg (N, K/G, G), in the order of the module doc."""
    for r in CLIP_RATIOS:
        yield int4_group_params(wg, symmetric, scale_dtype, r)
    if not symmetric:  # (symmetric: the clip ratios are already its scale grid, and it has no offset)
        lo, hi = wg.amin(-1), wg.amax(-1)
        base, centre = (hi - lo) / Q_MAX, (lo + hi) / 2
        for r in SCALE_RATIOS:
            s = _stored(torch.where(hi > lo, base * r, torch.ones_like(base)), scale_dtype)
            for t in OFFSET_SHIFTS:
                yield s, _stored(centre - (Q_MAX / 2 - t) * s, scale_dtype)
    n, ng, g = wg.shape
    s_sub, m_sub = int4_group_params(wg.reshape(n, ng, g // SUBBLOCK, SUBBLOCK), symmetric, scale_dtype)
    for b in range(g // SUBBLOCK):
        if m_sub is None:
            yield s_sub[..., b], None
            continue
        for j in SUBBLOCK_SHIFTS:
            yield s_sub[..., b], _stored(m_sub[..., b] + j * s_sub[..., b], scale_dtype)


def _refit(wg: torch.Tensor, hb: torch.Tensor, s: torch.Tensor, m: torch.Tensor | None,
           scale_dtype: torch.dtype) -> Params:
    """Least-squares scale (and offset) under H_gg for the codes that (s, m) give: (N, K/G) each."""
    q = int4_codes(wg, s, m)  # (N, K/G, G)
    if m is None:
        q = q - SYMMETRIC_ZERO
        qh = torch.einsum("ngi,gij->ngj", q, hb)
        den = (qh * q).sum(-1)
        new_s = (qh * wg).sum(-1) / den
        ok = den > 0
        return _stored(torch.where(ok & (new_s > 0), new_s, s), scale_dtype), None
    one = torch.ones_like(q[:1, :, :])  # (1, K/G, G)
    qh = torch.einsum("ngi,gij->ngj", q, hb)  # q H
    oh = torch.einsum("ngi,gij->ngj", one, hb)  # 1 H
    a11, a12, a22 = (qh * q).sum(-1), (qh * one).sum(-1), (oh * one).sum(-1)  # (N, K/G), (1, K/G)
    b1, b2 = (qh * wg).sum(-1), (oh * wg).sum(-1)
    det = a11 * a22 - a12 * a12
    ok = det.abs() > 1e-12 * (a11 * a22).abs().clamp(min=1e-30)
    safe = torch.where(ok, det, torch.ones_like(det))
    new_s = (b1 * a22 - a12 * b2) / safe
    new_m = (a11 * b2 - a12 * b1) / safe
    ok = ok & (new_s > 0)
    return _stored(torch.where(ok, new_s, s), scale_dtype), _stored(torch.where(ok, new_m, m), scale_dtype)


def search_group_params(w: torch.Tensor, h: torch.Tensor, group: int, symmetric: bool,
                        scale_dtype: torch.dtype) -> Params:
    """Per (row, group) scale and offset (N, K/G, FP32 holding stored values) with the smallest error under ``h``."""
    n, k = w.shape
    ng = k // group
    wf = w.to(torch.float32)
    wg = wf.reshape(n, ng, group)
    hf = h.to(torch.float32)
    best_err = torch.full((n, ng), float("inf"))
    best_s = torch.ones((n, ng))
    best_m = None if symmetric else torch.zeros((n, ng))

    def keep(s: torch.Tensor, m: torch.Tensor | None) -> None:
        nonlocal best_err, best_s, best_m
        err = group_errors(wf - snap(wg, s, m).reshape(n, k), hf, group)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_s = torch.where(better, s, best_s)
        if best_m is not None:
            best_m = torch.where(better, m, best_m)

    for s, m in _candidates(wg, symmetric, scale_dtype):
        keep(s, m)
    hb = torch.stack([hf[i * group:(i + 1) * group, i * group:(i + 1) * group] for i in range(ng)])  # (K/G, G, G)
    for _ in range(REFITS):
        keep(*_refit(wg, hb, best_s, best_m, scale_dtype))
    return best_s, best_m
