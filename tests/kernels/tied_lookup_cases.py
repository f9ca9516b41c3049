"""Tables and tokens for fused_tied_lookup's checks (interpreter and GPU), and the comparison with its reference."""

from __future__ import annotations

import torch

from edgekit.kernels.fused_tied_lookup import fused_tied_lookup_reference
from edgekit.kernels.int4_layout import quantize_int4_rtn
from edgekit.quant.weights import quantize_per_channel

VOCAB = 37  # rows of a test table: a few dozen, so that drawn tokens repeat and reach the last row


def lookup_case(fmt: str, *, width: int, group: int = 32, symmetric: bool = True,
                scale_dtype: torch.dtype = torch.float16, tokens: int = 1, seed: int = 0,
                device: str = "cpu") -> dict:
    """The operator's tensor arguments: ``tokens`` int64 ids (the last row among them) and a (VOCAB, width) table in
    ``fmt``: "int4" (W4A16, ``group``, offsets unless ``symmetric``, scales in ``scale_dtype``), "int8" (FP32 channel
    scales) or "fp16" (as stored)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(VOCAB, width, generator=g) * 0.05
    ids = torch.randint(0, VOCAB, (tokens,), generator=g)
    ids[-1] = VOCAB - 1
    scale = offset = None
    if fmt == "int4":
        weight, scale, offset = quantize_int4_rtn(w, group, symmetric=symmetric, scale_dtype=scale_dtype)
    elif fmt == "int8":
        weight, scale = quantize_per_channel(w)
    else:
        weight = w.half()
    move = (lambda t: None if t is None else t.to(device))
    return {"tokens": ids.to(device), "weight": move(weight), "scale": move(scale), "offset": move(offset)}


def mismatches(fn, *, tokens, weight, scale, offset, dtype: torch.dtype, row_scale) -> int:
    """Elements of ``fn``'s rows that differ from the reference's (computed on the CPU), bit for bit; the rows' dtype
    and shape must be the reference's."""
    name = str(dtype).removeprefix("torch.")
    got = fn(tokens, weight, scale, offset, name, row_scale)
    cpu = (lambda t: None if t is None else t.cpu())
    want = fused_tied_lookup_reference(cpu(tokens), cpu(weight), cpu(scale), cpu(offset), name, row_scale)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    return int((got.cpu().view(torch.int16 if want.element_size() == 2 else torch.int32)
                != want.view(torch.int16 if want.element_size() == 2 else torch.int32)).sum())
