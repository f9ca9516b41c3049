"""The ONNX graph being written: nodes, initializers, fallback functions and the op counts.

``onnx_graph`` walks the model's graph and ``onnx_glue``'s emitters write into
one ``OnnxGraphWriter``. It keeps the output byte-deterministic (initializers in
first-use order, one per distinct tensor, so a tied embedding and LM head share
one; functions sorted when the model is made) and gives an emitter what it
reads: the config, the graph walked, the static batch and bucket, the
activation dtype.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
from onnx import TensorProto, helper, numpy_helper

from edgekit.errors import ExportError
from edgekit.export.onnx_functions import CUSTOM_OPS, DOMAIN
from edgekit.graph.executor import weight_at
from edgekit.graph.node import Graph, Node
from edgekit.model.config import ModelConfig
from edgekit.model.decoder import ModelWeights

EXPORT_DTYPES = {"float32": (torch.float32, TensorProto.FLOAT), "float16": (torch.float16, TensorProto.FLOAT16)}


class OnnxGraphWriter:
    """The ONNX graph being written: nodes, initializers (one per distinct tensor), fallback functions, and what an
    emitter reads (the config, the graph walked, the static batch and bucket, the activation dtype)."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, graph: Graph, *, dtype: str, batch: int,
                 bucket: int, present_kv: bool):
        self.config, self.weights, self.graph = config, weights, graph
        self.batch, self.bucket, self.present_kv = batch, bucket, present_kv
        self.activation, self.onnx_dtype = EXPORT_DTYPES[dtype]
        self.np_dtype = np.float16 if self.activation == torch.float16 else np.float32
        self.nodes: list = []
        self.initializers: list[TensorProto] = []
        self.outputs: list = []  # graph outputs besides the logits (present_kv)
        self.functions: dict[tuple[str, str], object] = {}  # (op_type, overload) -> FunctionProto
        self.op_counts: Counter[str] = Counter()
        self._graph_outputs = {v: role for role, v in graph.outputs.items()}
        self._by_tensor: dict[tuple, str] = {}  # one initializer per distinct tensor (tied embeddings)
        self._names: set[str] = set()
        self._consts: dict[str, np.ndarray] = {}
        self._keep: list[torch.Tensor] = []  # holds every keyed tensor so its address cannot be reused

    # -- values and initializers ------------------------------------------------------------------------------
    def out(self, node: Node, role: str) -> str:
        """The ONNX name of the value ``node`` defines as ``role``: its graph value name, or the graph output's role
        ("logits") for a graph output."""
        value = node.outputs.get(role, f"{node.name}.{role}")
        return self._graph_outputs.get(value, value)

    def weight_at(self, path: str):
        return weight_at(self.weights, path)

    def weight(self, name: str, t: torch.Tensor, cast: torch.dtype | None = None) -> str:
        """An initializer for ``t`` (cast to ``cast`` when given); a tensor already written keeps its first name."""
        cast = None if cast == t.dtype else cast
        key = (t.data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype, cast)
        if key in self._by_tensor:
            return self._by_tensor[key]
        if name in self._names:
            raise ExportError(f"two different tensors would both be the initializer {name!r}",
                              hint="this is an edgekit bug; please report it with the model")
        self._keep.append(t)
        t = t.detach().to("cpu")
        self._by_tensor[key] = name
        return self._initializer(name, (t if cast is None else t.to(cast)).numpy())

    def const(self, name: str, value) -> str:
        """An initializer for a constant of the graph itself; nodes asking for the same name share it."""
        value = np.ascontiguousarray(value)
        if name in self._consts:
            assert np.array_equal(self._consts[name], value) and self._consts[name].dtype == value.dtype, name
            return name
        self._consts[name] = value
        return self._initializer(name, value)

    def _initializer(self, name: str, value: np.ndarray) -> str:
        self._names.add(name)
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    # -- nodes ------------------------------------------------------------------------------------------------
    def node(self, op_type: str, inputs: list[str], outputs: list[str], name: str, **attrs) -> str:
        """A standard ONNX node; returns its first output."""
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=name, **attrs))
        return outputs[0]

    def custom(self, op: str, inputs: dict[str, str | None], outputs: list[str], name: str, **attrs) -> None:
        """One edgekit node, and the fallback function for its overload if not yet in the model."""
        cop = CUSTOM_OPS[op]
        present = frozenset(k for k, v in inputs.items() if v)
        overload = cop.overload(present)
        if (cop.op_type, overload) not in self.functions:
            self.functions[(cop.op_type, overload)] = cop.function(present)
        node = helper.make_node(cop.op_type, cop.node_inputs(inputs), outputs, name=name, domain=DOMAIN,
                                plugin_version=cop.plugin_version, **attrs)
        node.overload = overload
        self.nodes.append(node)
        self.op_counts[cop.op_type] += 1
