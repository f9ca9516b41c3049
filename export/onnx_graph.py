"""The prefill graph of one static bucket as ONNX: a walk of the model's declared prefill graph (no tracing).

``build_prefill_model`` walks ``edgekit.graph.paths.path_graph(config, schemes,
"prefill")``, the graph the decoder's ``prefill`` runs, node by node:

- a registry operator node becomes the ``edgekit`` node its operator declares
  (``onnx_functions.CUSTOM_OPS``), its inputs bound by the operator spec's input
  names exactly as the executor binds them (``graph.executor.input_source``:
  graph values, the step's ``@tokens``/``@seq_lens``, weight paths, projection
  record fields), its attributes those the spec names;
- a glue node becomes the standard ops its emitter writes (``onnx_glue``).

So a new operator needs nothing here, and a new glue op one emitter. The walk
keeps the output deterministic (same weights -> same bytes) and readable: ONNX
values carry the graph's value names (``blocks.3/attn_norm.y``), nodes the graph's
node names, initializers their weight paths (``blocks.3.attn_norm``; a
projection record's field is named after the operator input that takes it,
``blocks.3.wqkv.qweight``, as the bundle's weight file names it).

Inputs: ``tokens`` int64 (B, T) padded to the bucket, ``seq_lens`` int64 (B,).
Output: ``logits`` (B, V) at each sequence's last real token, and with
``present_kv`` the rotated keys and values of every layer, (B, Hkv, T, D).
"""

from __future__ import annotations

import json
from collections import Counter

import torch
from onnx import ModelProto, TensorProto, helper

import edgekit
from edgekit.errors import ExportError, OperatorError, ShapeError
from edgekit.export.onnx_functions import CUSTOM_OPS, DOMAIN, DOMAIN_VERSION, IR_VERSION, OPSET
from edgekit.export.onnx_glue import GLUE_EMITTERS
from edgekit.export.onnx_writer import EXPORT_DTYPES, OnnxGraphWriter
from edgekit.graph.builder import LinearSchemes
from edgekit.graph.executor import RECORD_FIELDS, input_source
from edgekit.graph.glue import is_glue
from edgekit.graph.node import PREFILL, PROJ, Node
from edgekit.graph.paths import path_graph
from edgekit.kernels.spec import FLOAT_DTYPES, TensorSpec
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import ModelWeights

# The step state a prefill graph reads -> the ONNX graph input that holds it
GRAPH_INPUTS = {"@tokens": "tokens", "@seq_lens": "seq_lens"}
_QUANTIZE_HINT = "quantize the weights with edgekit's quantizer before exporting, or take GGUF tensors in as they are"


def _cast_for(t: TensorSpec, tensor: torch.Tensor, node: Node, path: str, activation: torch.dtype):
    """The dtype a weight is written in, from the operator input that takes it: the activation dtype for an input
    that follows it (every float dtype), as stored for one of the input's dtypes, else the input's one float dtype
    (an FP16 per-channel scale for an FP32 input). Anything else is refused."""
    stored = str(tensor.dtype).removeprefix("torch.")
    if set(FLOAT_DTYPES) <= set(t.dtypes) and tensor.is_floating_point():
        return activation
    if stored in t.dtypes:
        return None
    floats = [d for d in t.dtypes if d in FLOAT_DTYPES]
    if tensor.is_floating_point() and len(floats) == 1:
        return getattr(torch, floats[0])
    raise OperatorError(f"{path}: {node.op} takes {t.name} as {' or '.join(t.dtypes)}, got {stored}",
                        hint=_QUANTIZE_HINT)


def _weight_input(w: OnnxGraphWriter, node: Node, t: TensorSpec, kind: str, key: str) -> str | None:
    """The initializer for operator input ``t`` bound to the weight ``key`` (a path, ``#field`` for one field of a
    projection record); None for an optional input the weights leave out."""
    path = key.partition("#")[0]
    tensor = w.weight_at(key)
    if tensor is None:
        if t.optional:
            return None
        raise OperatorError(f"{path}: {node.op} needs {t.name}, which the weights do not have", hint=_QUANTIZE_HINT)
    name = key.replace("#", ".") if kind == "weight" else f"{path}.{t.name}"
    return w.weight(name, tensor, _cast_for(t, tensor, node, path, w.activation))


def _check_record_taken(w: OnnxGraphWriter, node: Node, taken: set[str]) -> None:
    """A projection record's field no input of the node takes would leave the export without a word: refuse it."""
    proj = node.weights[PROJ]
    record = w.weight_at(proj)
    for fld in sorted(set(RECORD_FIELDS.values()) - taken):
        if getattr(record, fld, None) is not None:
            raise OperatorError(f"{proj}: the {record.op} weights carry a {fld}, which {node.op} does not take",
                                hint=_QUANTIZE_HINT)


def _operator_node(w: OnnxGraphWriter, node: Node, values: dict[str, str]) -> dict[str, str]:
    """A registry operator node as the edgekit node its operator declares; returns its outputs by role."""
    cop = CUSTOM_OPS.get(node.op)
    if cop is None:
        raise ExportError(f"{node.name}: operator {node.op!r} declares no ONNX function, so the graph cannot be "
                          "exported", hint="declare one in its module: Operator(..., onnx=OnnxFunction(...))")
    spec, proj = cop.spec, node.weights.get(PROJ)
    inputs: dict[str, str | None] = {}
    taken: set[str] = set()  # fields of the node's projection record that some input takes
    for t in spec.inputs:
        kind, key = input_source(node, t.name, t.optional)  # exactly as the executor binds it
        if kind in ("value", "state"):
            inputs[t.name] = _graph_value(key, values, node)
        elif kind in ("weight", "field"):
            path, _, fld = key.partition("#")
            if path == proj:
                taken.add(fld)
            inputs[t.name] = _weight_input(w, node, t, kind, key)
        else:
            inputs[t.name] = None
    if proj is not None:
        _check_record_taken(w, node, taken)
    outputs = [w.out(node, t.name) for t in spec.outputs]
    attrs = {a: node.attrs[a] for a in spec.attributes if node.attrs.get(a) is not None}
    w.custom(node.op, inputs, outputs, node.name, **attrs)
    return dict(zip((t.name for t in spec.outputs), outputs))


def _graph_value(key: str, values: dict[str, str], node: Node) -> str:
    if not key.startswith("@"):
        return values[key]
    if key not in GRAPH_INPUTS:
        raise ExportError(f"{node.name}: {node.op} reads the step state {key}, which the prefill export has no input "
                          f"for (it has {', '.join(GRAPH_INPUTS)})",
                          hint="give the export an input for it (GRAPH_INPUTS in export/onnx_graph.py)")
    return GRAPH_INPUTS[key]


def _glue_node(w: OnnxGraphWriter, node: Node, values: dict[str, str]) -> dict[str, str]:
    emit = GLUE_EMITTERS.get(node.op)
    if emit is None:
        raise ExportError(f"{node.name}: the glue op {node.op!r} has no ONNX emitter; known: "
                          f"{', '.join(GLUE_EMITTERS)}",
                          hint="add one to GLUE_EMITTERS in export/onnx_glue.py")
    return emit(w, node, {role: _graph_value(v, values, node) for role, v in node.inputs.items()})


def build_prefill_model(
    config: ModelConfig, weights: ModelWeights, bucket: int, *, dtype: str = "float32", batch: int = 1,
    present_kv: bool = False,
) -> tuple[ModelProto, Counter]:
    """The prefill graph for one bucket, with every initializer inline. Returns (model, edgekit op_type counts)."""
    if dtype not in EXPORT_DTYPES:
        raise ShapeError(f"export dtype {dtype!r} is not supported; expected one of: {', '.join(EXPORT_DTYPES)}")
    if not 1 <= bucket <= config.max_position_len:
        raise ShapeError(f"bucket {bucket} is outside 1..{config.max_position_len} (the model's max_position_len)")
    if batch < 1:
        raise ShapeError(f"batch must be >= 1, got {batch}")
    if len(weights.blocks) != config.n_layers:
        raise ShapeError(f"the weights have {len(weights.blocks)} blocks but the config says "
                         f"n_layers={config.n_layers}")

    graph = path_graph(config, LinearSchemes.of_weights(weights), PREFILL)
    w = OnnxGraphWriter(config, weights, graph, dtype=dtype, batch=batch, bucket=bucket, present_kv=present_kv)
    values: dict[str, str] = {}  # graph value -> its ONNX name
    for node in graph.nodes:
        outs = _glue_node(w, node, values) if is_glue(node.op) else _operator_node(w, node, values)
        for role, value in node.outputs.items():
            values[value] = outs[role]

    cfg, B, T = config, batch, bucket
    onnx_graph = helper.make_graph(
        w.nodes, f"{cfg.name}.prefill.{T}",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, [B, T]),
         helper.make_tensor_value_info("seq_lens", TensorProto.INT64, [B])],
        [helper.make_tensor_value_info("logits", w.onnx_dtype, [B, cfg.vocab_size]), *w.outputs],
        initializer=w.initializers,
    )
    model = helper.make_model(
        onnx_graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)],
        functions=[w.functions[key] for key in sorted(w.functions)],  # sorted: byte-identical output
        producer_name="edgekit",
        producer_version=edgekit.__version__,
        doc_string=f"edgekit prefill graph: {cfg.name}, bucket {T}, batch {B}, {dtype}",
    )
    model.ir_version = IR_VERSION
    meta = {
        "edgekit.graph": "prefill",
        "edgekit.bucket": str(T),
        "edgekit.batch": str(B),
        "edgekit.dtype": dtype,
        "edgekit.model_config": json.dumps(cfg.to_dict(), sort_keys=True),
    }
    helper.set_model_props(model, meta)
    return model, w.op_counts
