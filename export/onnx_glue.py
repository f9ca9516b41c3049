"""The glue ops of a prefill graph (``edgekit/graph/glue.py``) as standard ONNX ops: one emitter per glue op.

An emitter gets the writer (``onnx_writer.OnnxGraphWriter``), the node and the
ONNX names of its inputs by role, adds the standard nodes the glue op stands
for and returns the ONNX names of its outputs by role. It computes what the
glue op's torch implementation computes for a prefill: the export walks the
same graph as the decoder, so a glue op the graph gains needs one entry in
``GLUE_EMITTERS`` and nothing else here.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import torch
from onnx import helper

from edgekit.export.onnx_embedding import quantized_gather
from edgekit.export.onnx_writer import OnnxGraphWriter
from edgekit.graph.node import Node
from edgekit.kernels.rope import rope_frequencies
from edgekit.model.rope_scaling import table_scaling
from edgekit.model.embedding import QuantizedEmbedding

Emitter = Callable[[OnnxGraphWriter, Node, Mapping[str, str]], dict[str, str]]


def _embed(w: OnnxGraphWriter, node: Node, ins: Mapping[str, str]) -> dict[str, str]:
    """Rows of the token table (B, T, C) [x scale, rounded to the activation dtype first, as the reference does]."""
    path, out, scale = node.weights["table"], w.out(node, "x"), node.attrs.get("scale")
    table = w.weight_at(path)
    rows = out if scale is None else f"{node.name}.rows"
    if isinstance(table, QuantizedEmbedding):  # tied quantized head: its rows, dequantized; no float table
        quantized_gather(w, table, ins["tokens"], (w.batch, w.bucket), node.name, rows)
    else:
        w.node("Gather", [w.weight(path, table, w.activation), ins["tokens"]], [rows], node.name, axis=0)
    if scale is not None:
        w.node("Mul", [rows, w.const(f"{node.name}.scale", np.array(scale, w.np_dtype))], [out], f"{node.name}.scale")
    return {"x": out}


def _rope_tables(w: OnnxGraphWriter, node: Node, ins: Mapping[str, str]) -> dict[str, str]:
    """cos/sin (B, T, D/2) of positions [0, T) of the node's RoPE table: FP32, as the decoder's tables."""
    theta = w.graph.rope[node.attrs["rope"]]
    cos, sin = rope_frequencies(w.config.head_dim, w.bucket, theta, torch.float32,  # (T, D/2)
                                scaling=table_scaling(w.config, node.attrs["rope"]))
    shape = w.const(f"{node.name}.shape", np.array([w.batch, w.bucket, w.config.head_dim // 2], np.int64))
    out = {}
    for role, table in (("cos", cos), ("sin", sin)):
        rows = w.const(f"{node.name}.{role}_table", table[None].numpy())
        out[role] = w.node("Expand", [rows, shape], [w.out(node, role)], f"{node.name}.{role}")
    return out


def _kv_store(w: OnnxGraphWriter, node: Node, ins: Mapping[str, str]) -> dict[str, str]:
    """Attention reads K and V as they are; with ``present_kv`` they are also the graph's present.<layer> outputs."""
    if w.present_kv:
        cfg = w.config
        for role, kind in (("k", "key"), ("v", "value")):
            name = f"present.{node.layer}.{kind}"
            w.node("Identity", [ins[role]], [name], f"{node.name}.{kind}")
            w.outputs.append(helper.make_tensor_value_info(name, w.onnx_dtype,
                                                           [w.batch, cfg.n_kv_heads, w.bucket, cfg.head_dim]))
    return {"k": ins["k"], "v": ins["v"]}


def _merge_heads(w: OnnxGraphWriter, node: Node, ins: Mapping[str, str]) -> dict[str, str]:
    """(B, Hq, T, D) -> (B, T, Hq D)."""
    o = w.node("Transpose", [ins["x"]], [f"{node.name}.bthd"], f"{node.name}.transpose", perm=[0, 2, 1, 3])
    shape = w.const("merge_heads.shape", np.array([w.batch, w.bucket, -1], np.int64))
    return {"y": w.node("Reshape", [o, shape], [w.out(node, "y")], node.name)}


def _add(w: OnnxGraphWriter, node: Node, ins: Mapping[str, str]) -> dict[str, str]:
    return {"y": w.node("Add", [ins["a"], ins["b"]], [w.out(node, "y")], node.name)}


def _last_token(w: OnnxGraphWriter, node: Node, ins: Mapping[str, str]) -> dict[str, str]:
    """(B, T, C) -> (B, C): each sequence's row at index seq_len - 1."""
    one = w.const("last_token.one", np.array([1], np.int64))
    last = w.node("Sub", [ins["seq_lens"], one], [f"{node.name}.index"], f"{node.name}.index")
    last = w.node("Unsqueeze", [last, one], [f"{node.name}.index2"], f"{node.name}.unsqueeze")  # (B, 1)
    return {"y": w.node("GatherND", [ins["x"], last], [w.out(node, "y")], node.name, batch_dims=1)}


GLUE_EMITTERS: dict[str, Emitter] = {
    "embed": _embed,
    "rope_tables": _rope_tables,
    "kv_store": _kv_store,
    "merge_heads": _merge_heads,
    "add": _add,
    "last_token": _last_token,
}
