"""The W4A16 weight layout: group-wise 4-bit weights, packed two per byte in GGML's nibble order.

One projection's INT4 weights are three tensors:

- ``qweight`` uint8 (N, K/2): 4-bit codes q in 0..15, two per byte. Within every
  32-element sub-block of a row, byte j (0..15) holds element j in its low nibble
  and element j + 16 in its high nibble. This is the order of GGML's Q4_0 / Q4_1
  blocks, so a GGUF file's 4-bit tensors are taken in with a byte copy (no
  dequantize-requantize), and a GEMV loads a sub-block's 16 bytes with one load
  and multiplies the two nibble halves with two contiguous halves of x.
  The half2 decode GEMV (``int4_half2_triton.py``) reads this order as it is: it pairs the activations to match
  (byte permutes of x, once per sub-block) instead of permuting the weights, so intake stays a byte copy.
- ``scale`` (N, K/G), float16 or float32: one scale per group of G = 32, 64 or 128
  consecutive elements of a row (G is a multiple of the sub-block).
- ``offset`` (N, K/G) of the scale's dtype, or None:
    asymmetric (``offset`` given):  w = q * scale + offset        (GGML Q4_1: d * q + m)
    symmetric  (``offset`` None):   w = (q - 8) * scale           (GGML Q4_0: d * (q - 8))

The group size is not stored: G = K / scale.shape[1]. With FP16 scales the
product q * scale (at most 15 significant bits) is exact in FP32, so the symmetric
form dequantizes bit for bit the same in every kernel, reference and exporter;
the asymmetric sum adds one FP32 rounding at most (FMA or not), inside every
operator tolerance.
"""

from __future__ import annotations

import torch

from edgekit.kernels.precision import accumulate_dtype, plain_ops_needed, product_in

SUBBLOCK = 32  # elements per nibble-order block (GGML's QK4_0 / QK4_1)
GROUP_SIZES = (32, 64, 128)
SYMMETRIC_ZERO = 8  # the code that stands for 0.0 in the symmetric form
Q_MAX = 15


def check_group(k: int, group: int) -> None:
    """Refuse a (K, group) pair the layout cannot hold, saying what would."""
    if group not in GROUP_SIZES:
        raise ValueError(f"INT4 group size {group} is not supported; expected one of {GROUP_SIZES}")
    if k % group:
        raise ValueError(f"INT4 weights need K divisible by the group size: K={k}, group={group}")


def group_size(qweight: torch.Tensor, scale: torch.Tensor) -> int:
    """G of a packed weight and its scales: K / scale.shape[1]."""
    k = qweight.shape[-1] * 2
    if scale.shape[-1] == 0 or k % scale.shape[-1]:
        raise ValueError(f"INT4 scales of shape {tuple(scale.shape)} do not divide K={k} into groups")
    return k // scale.shape[-1]


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Codes (N, K) in 0..15 (any integer dtype) -> packed uint8 (N, K/2) in GGML nibble order. K % 32 == 0."""
    n, k = q.shape
    if k % SUBBLOCK:
        raise ValueError(f"INT4 packing needs K divisible by {SUBBLOCK}, got K={k}")
    if q.numel() and (int(q.min()) < 0 or int(q.max()) > Q_MAX):
        raise ValueError(f"INT4 codes must lie in 0..{Q_MAX}, got {int(q.min())}..{int(q.max())}")
    blocks = q.to(torch.uint8).reshape(n, k // SUBBLOCK, 2, SUBBLOCK // 2)  # [.., 0, j] = elem j, [.., 1, j] = elem j+16
    packed = blocks[:, :, 0, :] | (blocks[:, :, 1, :] << 4)
    return packed.reshape(n, k // 2).contiguous()


def _packed_shape(qweight: torch.Tensor) -> tuple[int, int]:
    """(N, K/2) of a packed weight whose rows hold whole sub-blocks; refused otherwise."""
    n, half = qweight.shape
    if half % (SUBBLOCK // 2):
        raise ValueError(f"packed INT4 rows must hold whole {SUBBLOCK}-element sub-blocks, got {half} bytes")
    return n, half


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """Packed uint8 (N, K/2) -> codes uint8 (N, K) in 0..15 (inverse of ``pack_int4``)."""
    n, half = _packed_shape(qweight)
    b = qweight.reshape(n, half // (SUBBLOCK // 2), 1, SUBBLOCK // 2)
    codes = torch.cat((b & 0x0F, b >> 4), dim=2)  # (N, blocks, 2, 16)
    return codes.reshape(n, half * 2)


_NIBBLE_TABLES: dict[tuple, torch.Tensor] = {}


def _nibble_table(dtype: torch.dtype, device: torch.device, centred: bool) -> torch.Tensor:
    """(256, 2) of a byte's two codes in ``dtype``: [b, 0] = low nibble, [b, 1] = high (less 8 if ``centred``)."""
    if device.type == "meta":  # shapes only (a kernel count): nothing to make, nothing to count
        return torch.empty(256, 2, dtype=dtype, device=device)
    key = (dtype, device, centred)
    table = _NIBBLE_TABLES.get(key)
    if table is None:  # made once a device and dtype, before any CUDA-graph capture (the step's warm-up runs first)
        b = torch.arange(256)
        table = torch.stack((b & 0x0F, b >> 4), dim=1) - (SYMMETRIC_ZERO if centred else 0)
        table = _NIBBLE_TABLES[key] = table.to(device=device, dtype=dtype)
    return table


def dequantize_int4(qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None = None,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weights (N, K) the packed tensors stand for, computed in FP32 (FP64 if ``dtype`` is float64), returned in
    ``dtype``.

    Few kernels, because a tied INT4 embedding runs this on every decode step (its rows): each byte's two codes
    come from a 256-entry table (one gather instead of mask, shift, concatenation and a cast), already centred in
    the symmetric form, the group scales broadcast over a view instead of being repeated to K, and the last op
    writes ``dtype`` itself (torch computes in its inputs' dtype and rounds once on the store, as a cast would)
    instead of a cast kernel after it. The values are those of q * scale (+ offset) in the accumulation dtype,
    rounded to ``dtype``: products and sums rounded as before."""
    acc = accumulate_dtype(dtype)
    g = group_size(qweight, scale)
    n, half = _packed_shape(qweight)
    table = _nibble_table(acc, qweight.device, centred=offset is None)
    pairs = table.index_select(0, qweight.reshape(-1).to(torch.int32))  # (N * K/2, 2): byte j -> elements j, j + 16
    # (N, groups, sub-blocks a group, 2, 16) in element order: a strided view, made contiguous by the product below
    q = pairs.view(n, half // (SUBBLOCK // 2), SUBBLOCK // 2, 2).transpose(-1, -2).unflatten(1, (-1, g // SUBBLOCK))
    s = scale[:, :, None, None, None]
    o = None if offset is None else offset[:, :, None, None, None]
    if plain_ops_needed(scale, o):  # the plain product (compile fuses the copy it needs)
        w = q * s if o is None else q * s + o
        return w.reshape(n, half * 2).to(dtype)
    # eagerly, into an element-order buffer: a product left to take q's strides would need a copy to reshape
    def buffer(t: torch.dtype) -> torch.Tensor:
        return torch.empty(q.shape, dtype=t, device=q.device)

    if o is None:
        w = product_in(q, s, dtype)
    elif dtype == acc:  # in place: a whole table's dequantization holds no third copy
        w = torch.mul(q, s, out=buffer(acc)).add_(o)
    else:
        w = torch.add(torch.mul(q, s, out=buffer(acc)), o, out=buffer(dtype))
    return w.view(n, half * 2)


def int4_group_params(wg: torch.Tensor, symmetric: bool, scale_dtype: torch.dtype = torch.float16,
                      clip: torch.Tensor | float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Round-to-nearest scale and offset for groups ``wg`` (..., G): FP32 tensors (...) holding their stored values.

    Symmetric: scale = max|w| / 7 (codes 1..15, 8 = zero), offset None. Asymmetric: scale = (max - min) / 15,
    offset = min. ``clip`` (a ratio in (0, 1], or one per group) clips the group to +-clip * max|w| first:
    calibrated methods trade clipping a few outliers for a finer grid. Values are rounded through ``scale_dtype``, so codes chosen
    against them reproduce what is stored.
    """
    wf = wg.to(torch.float32)
    amax = wf.abs().amax(dim=-1) * clip  # values beyond +-amax are clipped (AWQ's rule)
    if symmetric:
        s = torch.where(amax > 0, amax / 7.0, torch.ones_like(amax)).to(scale_dtype).to(torch.float32)
        return s, None
    lo, hi = torch.maximum(wf.amin(dim=-1), -amax), torch.minimum(wf.amax(dim=-1), amax)
    s = torch.where(hi > lo, (hi - lo) / Q_MAX, torch.ones_like(hi)).to(scale_dtype).to(torch.float32)
    return s, lo.to(scale_dtype).to(torch.float32)


def int4_codes(wg: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
    """Nearest codes (..., G) in 0..15 of groups ``wg`` (..., G) for FP32 ``scale`` / ``offset`` (...)."""
    wf = wg.to(torch.float32)
    if offset is None:
        return torch.clamp(torch.round(wf / scale[..., None]) + SYMMETRIC_ZERO, 0, Q_MAX)
    return torch.clamp(torch.round((wf - offset[..., None]) / scale[..., None]), 0, Q_MAX)


def quantize_int4_rtn(w: torch.Tensor, group: int, *, symmetric: bool = False,
                      scale_dtype: torch.dtype = torch.float16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Round-to-nearest group-wise INT4 of a float (N, K) weight: (qweight, scale, offset or None).

    The plain baseline every calibrated method (GPTQ, AWQ-style scaling) must beat; codes are chosen against the
    scale and offset as stored (rounded to ``scale_dtype``), so dequantizing reproduces what was optimised.
    Symmetric: scale = max|w| / 7 (codes 1..15, 8 = zero). Asymmetric: scale = (max - min) / 15, offset = min.
    """
    n, k = w.shape
    check_group(k, group)
    wf = w.to(torch.float32).reshape(n, k // group, group)
    s, m = int4_group_params(wf, symmetric, scale_dtype)
    q = int4_codes(wf, s, m)
    packed = pack_int4(q.reshape(n, k).to(torch.uint8))
    return packed, s.to(scale_dtype), None if m is None else m.to(scale_dtype)
