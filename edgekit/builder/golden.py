"""Golden vectors for the build: seeded inputs at the model's shapes, one case per operator and bucket.

Expected outputs are the FP64 reference (edgekit.bundle.golden.make_case).
The inputs of one call come from the operator's own module (``Operator.golden_inputs``:
FP16 activations, as the plugins run them; linear layers at the model's input
width but at most ``kernels.operator.GOLDEN_MAX_N`` output rows).
"""

from __future__ import annotations

import torch

from edgekit.bundle.golden import GoldenCase, make_case
from edgekit.graph.paths import decode_only_operators
from edgekit.kernels.registry import operator
from edgekit.model.config import ModelConfig

# Row-wise operators (each token independent) are checked on at most this many rows per bucket: more
# rows only repeat the same program over a longer grid, and full 2048-row FP64 outputs would make the
# bundle hundreds of MB. Attention keeps the full bucket length, where the length changes the math.
MAX_ROWWISE_ROWS = 256
# A fused decode operator runs one token per sequence: its cases are decode calls of 1 and of a few sequences
# (each at its own cache position), not prefill buckets (a 2048-row call would carry 2048 KV caches).
DECODE_GOLDEN_ROWS = (1, 4)
# A fused layer operator's plugin ships a kernel per weight format (FP16, INT8, INT4), the call's weights choosing
# one: besides the FP16 cases, a one-row decode call with each quantized format, so no kernel ships unchecked.
QUANTIZED_GOLDEN_FORMATS = ("int8", "int4")


def op_inputs(op: str, cfg: ModelConfig, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    """(inputs, attributes) of one call of ``op`` at ``rows`` tokens (the operator module's golden inputs)."""
    return operator(op).golden_inputs(cfg, rows, context, g)


def golden_cases(op: str, cfg: ModelConfig, buckets: tuple[int, ...], context: int, seed: int = 0) -> list[GoldenCase]:
    """One case per bucket (a decode case per context length for attention_decode, and M=1 for linears)."""
    record = operator(op)
    cases = []
    plan = [(b, b) for b in buckets]  # (bucket, rows)
    if record.decode_case:
        plan = [(1, 1)] + plan  # the decode path (GEMV kernels)
    if op in decode_only_operators():
        plan = [(1, rows) for rows in DECODE_GOLDEN_ROWS]
    seen = set()
    for i, (bucket, rows) in enumerate(plan):
        if record.rowwise:
            rows = min(rows, MAX_ROWWISE_ROWS)
        if record.rowwise and rows in seen:
            continue  # the same row count again adds nothing
        seen.add(rows)
        g = torch.Generator().manual_seed(seed * 1000 + i)
        inputs, attrs = op_inputs(op, cfg, rows, context, g)
        cases.append(make_case(op, inputs, attrs, name=f"{op}_b{bucket}_r{rows}", seed=seed * 1000 + i, bucket=bucket))
    if op in decode_only_operators() and {"scale", "offset"} <= {t.name for t in record.spec.inputs}:
        for j, fmt in enumerate(QUANTIZED_GOLDEN_FORMATS):
            case_seed = seed * 1000 + len(plan) + j
            inputs, attrs = op_inputs(op, cfg, 1, context, torch.Generator().manual_seed(case_seed))
            cases.append(make_case(op, with_quantized_weight(inputs, fmt), attrs, name=f"{op}_b1_r1_{fmt}",
                                   seed=case_seed, bucket=1))
    return cases


def with_quantized_weight(inputs: dict, fmt: str) -> dict:
    """The call's FP16 ``weight`` as INT8 with FP32 channel scales (``int8``) or as W4A16 with FP16 group scales and
    offsets (``int4``, the largest group that divides its width); the expected outputs use these weights."""
    from edgekit.kernels.int4_layout import GROUP_SIZES, quantize_int4_rtn
    from edgekit.quant.weights import quantize_per_channel

    w = inputs["weight"]
    if fmt == "int8":
        q, scale = quantize_per_channel(w.float())
        return {**inputs, "weight": q, "scale": scale}
    group = max(gs for gs in GROUP_SIZES if w.shape[1] % gs == 0)
    q, scale, offset = quantize_int4_rtn(w, group, symmetric=False, scale_dtype=torch.float16)
    return {**inputs, "weight": q, "scale": scale, "offset": offset}
