"""Group-wise INT4 rounding as calibration sees it: fake quantization, output error under H, clip-ratio search.

Every calibrated INT4 method (edgekit.quant.gptq, edgekit.quant.awq) scores a
candidate weight W' of a layer by the error it causes on that layer's
calibration inputs X, without keeping X: with H = X^T X (K, K),

    ||X W^T - X W'^T||_F^2 = sum_n e_n H e_n^T,   e = W - W' (N, K).

Restricted to one group of columns g, H_gg gives the part of that error the
group causes by itself; the clip-ratio search picks, for every (row, group),
the ratio whose rounded group has the smallest such error (AWQ's
``auto_clip``, scored with H instead of a sample of X).
"""

from __future__ import annotations

import torch

from edgekit.kernels.int4_layout import SYMMETRIC_ZERO, int4_codes, int4_group_params, pack_int4
from edgekit.kernels.linear import LinearWeights

# Ratios tried by the clip search: 1.0 (no clipping, plain round-to-nearest) down to 0.5.
CLIP_RATIOS = tuple(1.0 - 0.05 * i for i in range(11))


def fake_quant(w: torch.Tensor, group: int, symmetric: bool, scale_dtype: torch.dtype,
               clip: torch.Tensor | float = 1.0) -> torch.Tensor:
    """The FP32 weight (N, K) that rounding ``w`` group-wise to INT4 stands for."""
    n, k = w.shape
    wg = w.to(torch.float32).reshape(n, k // group, group)
    return snap(wg, *int4_group_params(wg, symmetric, scale_dtype, clip)).reshape(n, k)


def snap(wg: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
    """The values groups ``wg`` (..., G) round to on the grid of FP32 ``scale`` / ``offset`` (...)."""
    q = int4_codes(wg, scale, offset)  # (..., G)
    return (q - SYMMETRIC_ZERO) * scale[..., None] if offset is None else q * scale[..., None] + offset[..., None]


def output_error(e: torch.Tensor, h: torch.Tensor) -> float:
    """sum_n e_n H e_n^T for an error e (N, K) and H (K, K): the squared output error on the calibration inputs."""
    return float(((e @ h) * e).sum())


def group_errors(e: torch.Tensor, h: torch.Tensor, group: int) -> torch.Tensor:
    """Per (row, group) output error (N, K/G) of e (N, K), each group scored with its own block H_gg."""
    n, k = e.shape
    ng = k // group
    eg = e.reshape(n, ng, group)
    hb = torch.stack([h[i * group:(i + 1) * group, i * group:(i + 1) * group] for i in range(ng)])  # (K/G, G, G)
    return torch.einsum("ngi,gij,ngj->ng", eg, hb, eg)


def search_clip(w: torch.Tensor, h: torch.Tensor, group: int, symmetric: bool, scale_dtype: torch.dtype) -> torch.Tensor:
    """Per (row, group) clip ratios (N, K/G) from CLIP_RATIOS with the smallest group output error under ``h``."""
    n, k = w.shape
    wf = w.to(torch.float32)
    best_err = torch.full((n, k // group), float("inf"))
    best = torch.ones((n, k // group))
    for r in CLIP_RATIOS:
        err = group_errors(wf - fake_quant(wf, group, symmetric, scale_dtype, r), h, group)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best = torch.where(better, torch.full_like(best, r), best)
    return best


def int4_record(codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None, bias: torch.Tensor | None,
                scale_dtype: torch.dtype) -> LinearWeights:
    """A linear_w4a16 record from codes (N, K) in 0..15 and FP32 group scale / offset (N, K/G) holding stored values."""
    return LinearWeights("linear_w4a16", pack_int4(codes.to(torch.uint8)), bias, scale.to(scale_dtype),
                         offset=None if offset is None else offset.to(scale_dtype))


def rtn_record(w: torch.Tensor, bias: torch.Tensor | None, group: int, symmetric: bool, scale_dtype: torch.dtype,
               clip: torch.Tensor | float = 1.0) -> LinearWeights:
    """Round-to-nearest (optionally with per-group clip ratios) as a linear_w4a16 record."""
    n, k = w.shape
    s, m = int4_group_params(w.to(torch.float32).reshape(n, k // group, group), symmetric, scale_dtype, clip)
    return params_record(w, bias, s, m, scale_dtype)


def params_record(w: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor, offset: torch.Tensor | None,
                  scale_dtype: torch.dtype) -> LinearWeights:
    """Round-to-nearest onto given group scales / offsets (N, K/G, FP32 holding stored values) as a linear_w4a16 record."""
    n, k = w.shape
    wg = w.to(torch.float32).reshape(n, scale.shape[1], k // scale.shape[1])
    return int4_record(int4_codes(wg, scale, offset).reshape(n, k), scale, offset, bias, scale_dtype)
