"""The nodes of a model graph and the graph itself: data, no arithmetic.

A node names an operator (a registry operator, or one of the few glue ops of
``graph.glue``: the embedding gather, residual adds, KV-cache writes, head
reshapes), binds each of its inputs by role to a value of the graph, binds its
weights by role to a weight path of the model (``blocks.3.wqkv``, ``norm``),
holds its attributes and names the values it defines. Like llama.cpp's one
``ggml_cgraph``, every consumer walks the same graph: the CPU reference, the GPU
steps (per operator and fused), the quantizer's calibration forward, the
planner's kernel counts and the ONNX export.

Values whose name starts with ``@`` are the step's state, not products of a node:
``@tokens``, ``@positions``, ``@seq_lens``, and per layer ``@k_cache``/``@v_cache``
(the cache tensors as written) and ``@k_read``/``@v_read`` (the cache as attention
reads it: dequantized for an INT8 cache), ``@cos_table``/``@sin_table`` (the RoPE
tables of the node's ``rope`` attribute), ``@split_arrivals``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

PREFILL, DECODE, SEQUENCE = "prefill", "decode", "sequence"
PHASES = (PREFILL, DECODE, SEQUENCE)
# The role of a node's projection weights: a LinearWeights record whose fields (weight/qweight, scale, offset, bias,
# smooth) feed the operator's inputs of those names.
PROJ = "proj"


def _frozen(d: Mapping | None) -> Mapping:
    return MappingProxyType(dict(d or {}))


@dataclass(frozen=True)
class Node:
    op: str  # a registry operator name, or a glue op (graph.glue.GLUE)
    name: str  # readable and unique in its graph: "blocks.3/attn_norm"
    inputs: Mapping[str, str] = field(default_factory=dict)  # role -> value name
    outputs: Mapping[str, str] = field(default_factory=dict)  # role -> value name it defines
    weights: Mapping[str, str] = field(default_factory=dict)  # role -> weight path
    attrs: Mapping[str, Any] = field(default_factory=dict)
    layer: int | None = None  # the block it belongs to; None outside the blocks

    def __post_init__(self):
        for key in ("inputs", "outputs", "weights", "attrs"):
            object.__setattr__(self, key, _frozen(getattr(self, key)))

    def with_changes(self, **changes) -> "Node":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        """A JSON-able view (plans and tests list nodes this way)."""
        attrs = {k: v for k, v in self.attrs.items() if isinstance(v, (int, float, str, bool, type(None)))}
        return {"op": self.op, "name": self.name, "layer": self.layer, "inputs": dict(self.inputs),
                "outputs": dict(self.outputs), "weights": dict(self.weights), "attrs": attrs}


@dataclass(frozen=True)
class Graph:
    """One forward of one architecture family at one phase, as an ordered list of nodes (a valid execution order)."""

    family: str
    phase: str  # PREFILL | DECODE | SEQUENCE
    nodes: tuple[Node, ...]
    outputs: Mapping[str, str]  # role ("logits", "token", "hidden") -> value name
    rope: Mapping[str, float] = field(default_factory=dict)  # RoPE table name -> base (theta)
    path: str = "base"  # "base", or the decode path whose fusions rewrote it ("per-operator", "fused")
    streams: tuple[tuple[str, str], ...] = ()  # per block: the residual stream value going in and coming out

    def __post_init__(self):
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "outputs", _frozen(self.outputs))
        object.__setattr__(self, "rope", _frozen(self.rope))
        object.__setattr__(self, "streams", tuple(tuple(s) for s in self.streams))

    def operators(self) -> list[str]:
        """Every operator the graph calls (glue ops included), in first-call order, each once."""
        return list(dict.fromkeys(n.op for n in self.nodes))

    def layer_nodes(self, layer: int) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.layer == layer)

    def counts(self) -> dict[str, int]:
        """Calls per operator."""
        out: dict[str, int] = {}
        for n in self.nodes:
            out[n.op] = out.get(n.op, 0) + 1
        return out

    def with_nodes(self, nodes, **changes) -> "Graph":
        return replace(self, nodes=tuple(nodes), **changes)
