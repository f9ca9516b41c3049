"""The embedding gather of the ONNX graph when the table is a tied, quantized LM head (edgekit.model.embedding).

The graph shares the head's initializers (``lm_head.qweight``, ``lm_head.scale``,
``lm_head.offset``): no floating-point copy of the table is written. The gathered
rows are dequantized with standard ops in FP32, exactly as
``QuantizedEmbedding.__getitem__`` does, then cast to the activation dtype:
INT8 rows times their per-row scale (divided by a W8A8 head's SmoothQuant
vector); grouped INT8 rows (a Q8_0 table) times their group scales; INT4 rows unpacked from GGML nibble order
(each 32-block's low nibbles, then its high ones; kernels/int4_layout.py) and scaled per group.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from edgekit.kernels.int4_layout import SYMMETRIC_ZERO
from edgekit.model.embedding import QuantizedEmbedding


def quantized_gather(g, emb: QuantizedEmbedding, tokens: str, shape: tuple[int, int], name: str, out: str) -> str:
    """Nodes computing ``emb[tokens]`` for static token ids of ``shape`` (B, T) into ``out`` (B, T, C), named after the
    graph node ``name``; returns ``out``."""
    h = emb.head
    B, T = shape
    C = emb.shape[1]
    f32 = TensorProto.FLOAT

    def n(op: str, inputs: list[str], step: str, **attrs) -> str:
        return g.node(op, inputs, [f"{name}/{step}.out"], f"{name}/{step}", **attrs)

    def c(const: str, value) -> str:
        return g.const(f"{name}.{const}", value)

    # The head's initializers as the LM head node names them (onnx_graph: <path>.<operator input>), stored as they are
    qw = g.weight("lm_head.qweight", h.weight)
    scale = g.weight("lm_head.scale", h.scale)
    q = n("Cast", [n("Gather", [qw, tokens], "qrows", axis=0)], "qrows_f32", to=f32)  # (B, T, C) | (B, T, C/2)
    s = n("Cast", [n("Gather", [scale, tokens], "scale_rows", axis=0)], "scale_f32", to=f32)  # (B, T) | (B, T, C/G)
    if h.op == "linear_w4a16":
        groups = h.scale.shape[1]
        hi = n("Floor", [n("Div", [q, c("sixteen", np.float32(16.0))], "div16")], "hi")
        lo = n("Sub", [q, n("Mul", [hi, c("sixteen_m", np.float32(16.0))], "hi16")], "lo")
        blocks = c("blocks_shape", np.array([B, T, C // 32, 1, 16], np.int64))
        codes = n("Concat", [n("Reshape", [lo, blocks], "lo_blocks"), n("Reshape", [hi, blocks], "hi_blocks")], "codes",
                  axis=3)  # (B, T, C/32, 2, 16): element order restored
        codes = n("Reshape", [codes, c("groups_shape", np.array([B, T, groups, -1], np.int64))], "code_groups")
        s = n("Unsqueeze", [s, c("group_axis", np.array([3], np.int64))], "scale_groups")  # (B, T, C/G, 1)
        if h.offset is not None:
            off = g.weight("lm_head.offset", h.offset)
            off = n("Cast", [n("Gather", [off, tokens], "offset_rows", axis=0)], "offset_f32", to=f32)
            off = n("Unsqueeze", [off, c("offset_axis", np.array([3], np.int64))], "offset_groups")
            w = n("Add", [n("Mul", [codes, s], "scaled"), off], "rows_groups")
        else:
            w = n("Mul", [n("Sub", [codes, c("zero", np.float32(SYMMETRIC_ZERO))], "centred"), s], "rows_groups")
        rows = n("Reshape", [w, c("rows_shape", np.array([B, T, C], np.int64))], "rows_f32")
    elif h.op == "linear_w8a16_grouped":  # (B, T, C) codes times (B, T, C/G) group scales
        groups = h.scale.shape[1]
        codes = n("Reshape", [q, c("groups_shape", np.array([B, T, groups, -1], np.int64))], "code_groups")
        s = n("Unsqueeze", [s, c("group_axis", np.array([3], np.int64))], "scale_groups")  # (B, T, C/G, 1)
        w = n("Mul", [codes, s], "rows_groups")
        rows = n("Reshape", [w, c("rows_shape", np.array([B, T, C], np.int64))], "rows_f32")
    else:
        rows = n("Mul", [q, n("Unsqueeze", [s, c("row_axis", np.array([2], np.int64))], "scale_col")], "rows_f32")
        if h.smooth is not None:
            rows = n("Div", [rows, g.weight("lm_head.smooth", h.smooth)], "rows_unsmoothed")
    return g.node("Cast", [rows], [out], f"{name}/cast", to=g.onnx_dtype)
