"""`bench --precision int4`: every block linear becomes a W4A16 record of the same shape (RTN, for speed)."""

from __future__ import annotations

import torch

from edgekit.bench.roofline import weight_bytes_per_token
from edgekit.bench.runner import quantized
from edgekit.model.presets import preset_config
from edgekit.model.weights import random_weights


def test_int4_bench_weights_are_w4a16_with_the_largest_group_that_divides_k():
    w = random_weights(preset_config("preset:tiny"), seed=0)
    q = quantized(w, "int4")
    for b, bq in zip(w.blocks, q.blocks):
        for name, lw in bq.linears().items():
            fp = b.linears()[name].weight
            assert lw.op == "linear_w4a16" and lw.weight.dtype == torch.uint8, name
            group = lw.in_features // lw.scale.shape[1]
            assert group == (128 if fp.shape[1] % 128 == 0 else 64 if fp.shape[1] % 64 == 0 else 32), name
            # round to nearest: within half a step (+ the fp16 rounding of the scale and offset)
            step = lw.scale.float().repeat_interleave(group, dim=1)
            assert ((lw.dequantized() - fp).abs() <= step * 0.5 + 1e-3 * fp.abs().max()).all(), name
    assert q.lm_head is w.lm_head and q.tok_embeddings is w.tok_embeddings  # LM head and embedding stay FP16
    assert weight_bytes_per_token(q) < weight_bytes_per_token(quantized(w, "int8")) < weight_bytes_per_token(w)
