"""GPTQ: INT4 rounding with second-order error compensation (Frantar et al., 2023).

Round-to-nearest rounds every weight on its own. GPTQ rounds the columns of a
layer one at a time and, after each, moves the rounding error onto the columns
not rounded yet, weighted by how the layer's inputs correlate: with H = X^T X
from calibration inputs X (N tokens, K), the update that minimises the output
error ||X W^T - X Wq^T|| for the remaining columns is

    err = (w_i - q_i) / [H^-1]_ii,   W[:, i+1:] -= err [H^-1]_{i, i+1:}

(using the upper Cholesky factor of H^-1, which gives the same updates as
re-inverting after every column). Columns are processed in blocks of 128 with
the updates to later blocks applied once per block (the "lazy batch" update).

Group scales and offsets are chosen as quantization proceeds: when the first
column of a group comes up, its scale/offset come from the group's current,
already-compensated values (with the clip ratio the H-weighted search finds
best, edgekit.quant.int4_rounding.search_clip). With ``act_order`` the
columns are processed in decreasing order of H's diagonal (the inputs with
the most energy first); the groups are then fixed before the loop from the
original weights ("static groups"), because the layout keeps groups of
consecutive columns. Parameters searched beforehand (``group_params``,
edgekit.quant.int4_group_search) are kept fixed the same way.

Dampening adds ``damp`` x mean(diag H) to the diagonal so that H is positive
definite even for inputs that never vary; inputs that are always zero get
their weights zeroed (nothing ever multiplies them).
"""

from __future__ import annotations

import torch

from edgekit.errors import QuantizationError
from edgekit.kernels.int4_layout import check_group, int4_codes, int4_group_params
from edgekit.kernels.linear import LinearWeights
from edgekit.quant.int4_rounding import int4_record, search_clip

BLOCK = 128  # columns per lazy-update block; a multiple of every group size


def _inverse_cholesky(h: torch.Tensor, damp: float, name: str) -> torch.Tensor:
    """Upper Cholesky factor of (H + damp * mean(diag H) I)^-1: FP32 (as GPTQ's own code), FP64 if FP32 fails."""
    k = h.shape[0]
    h = h.to(torch.float64).clone()
    h += damp * float(torch.diag(h).mean()) * torch.eye(k, dtype=torch.float64)
    for dt in (torch.float32, torch.float64):
        lower, info = torch.linalg.cholesky_ex(h.to(dt))
        if int(info) == 0:
            u, info = torch.linalg.cholesky_ex(torch.cholesky_inverse(lower), upper=True)
            if int(info) == 0:
                return u.to(torch.float32)
    raise QuantizationError(f"{name}: the calibration Hessian is not positive definite even with damping {damp}",
                            hint="raise the damping or use more calibration tokens")


def gptq_quantize(w: torch.Tensor, h: torch.Tensor, group: int, *, symmetric: bool = False,
                  scale_dtype: torch.dtype = torch.float16, damp: float = 0.01, act_order: bool = False,
                  search_clip_ratio: bool = True, bias: torch.Tensor | None = None, name: str = "weight",
                  group_params: tuple[torch.Tensor, torch.Tensor | None] | None = None) -> LinearWeights:
    """A linear_w4a16 record for a float weight (N, K), given H = X^T X (K, K) of its calibration inputs.

    ``group_params`` (scale, offset or None, each (N, K/G) FP32 holding stored values) fixes the groups' parameters
    before the loop (static groups) instead of choosing them as the columns come up.
    """
    n, k = w.shape
    check_group(k, group)
    if h.shape != (k, k):
        raise QuantizationError(f"{name}: Hessian of shape {tuple(h.shape)} does not match a weight of shape {(n, k)}; "
                                f"expected ({k}, {k})")
    ng = k // group
    scale = torch.empty((n, ng))
    offset = None if symmetric else torch.empty((n, ng))
    static = act_order or group_params is not None
    if group_params is not None:
        if (group_params[1] is None) != symmetric or group_params[0].shape != (n, ng):
            raise QuantizationError(f"{name}: fixed group parameters do not match a {'symmetric' if symmetric else 'asymmetric'} "
                                    f"layout of ({n}, {ng}) groups")
        scale[:] = group_params[0]
        if offset is not None:
            offset[:] = group_params[1]
    elif act_order:  # static groups, from the original weights in their own column order
        clip = search_clip(w.detach(), h.to(torch.float32), group, symmetric, scale_dtype) if search_clip_ratio else 1.0
        s, m = int4_group_params(w.detach().to(torch.float32).reshape(n, ng, group), symmetric, scale_dtype, clip)
        scale[:] = s
        if offset is not None:
            offset[:] = m

    W = w.detach().to(torch.float32).clone()
    h = h.to(torch.float64).clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    W[:, dead] = 0.0
    perm = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(k)
    W, h = W[:, perm], h[perm][:, perm]
    u = _inverse_cholesky(h, damp, name)  # (K, K) upper
    hf = h.to(torch.float32)
    codes = torch.empty((n, k))
    for i1 in range(0, k, BLOCK):
        i2 = min(i1 + BLOCK, k)
        W1 = W[:, i1:i2].clone()
        err1 = torch.zeros_like(W1)
        u1 = u[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = int(perm[i1 + i])
            g = col // group
            if not static and col % group == 0:  # a new group starts: parameters from its current values
                cur = W1[:, i:i + group]
                hg = hf[i1 + i:i1 + i + group, i1 + i:i1 + i + group]
                clip = search_clip(cur, hg, group, symmetric, scale_dtype)[:, 0] if search_clip_ratio else 1.0
                s, m = int4_group_params(cur[:, None, :], symmetric, scale_dtype,
                                         clip[:, None] if search_clip_ratio else 1.0)
                scale[:, g] = s[:, 0]
                if offset is not None:
                    offset[:, g] = m[:, 0]
            wc = W1[:, i]
            sg = scale[:, g]
            mg = None if offset is None else offset[:, g]
            qc = int4_codes(wc[:, None], sg, mg)[:, 0]  # (N,)
            deq = (qc - 8.0) * sg if mg is None else qc * sg + mg
            codes[:, i1 + i] = qc
            e = (wc - deq) / u1[i, i]
            W1[:, i:] -= e[:, None] * u1[i, i:][None, :]
            err1[:, i] = e
        W[:, i2:] -= err1 @ u[i1:i2, i2:]
    codes = codes[:, torch.argsort(perm)]  # back to the original column order
    return int4_record(codes, scale, offset, bias, scale_dtype)
