"""Fusion as a rewrite: each fused operator's declared pattern (``kernels/fusion.py``) replaces the runs of nodes
that match it.

A run matches when its operators follow the pattern (``"linear"``: a projection in
one of the fusion's weight schemes), it lies in one block (or after the blocks, for
a head fusion), every node after the first consumes a value made inside the run,
and every value the run makes that is used after it is one the fused operator
outputs. The fused node binds its inputs, weights and attributes as the fusion
declares and defines the same value names the replaced nodes defined, so the rest
of the graph is unchanged. Longer patterns are tried first. Nodes a rewrite leaves
without a consumer (a decode step's RoPE row gather, once every RoPE is fused) are
dropped, except glue that writes state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edgekit.errors import OperatorError
from edgekit.graph.glue import GLUE
from edgekit.graph.node import PROJ, Graph, Node
from edgekit.kernels.fusion import HEAD, LAYER, LINEAR, Fusion, pattern_binding
from edgekit.kernels.registry import OPERATORS


@dataclass
class Rewrite:
    """What a rewrite did: the graph, and for each fused operator the operators it stands in for."""

    graph: Graph
    replaced: dict[str, set[str]] = field(default_factory=dict)  # fused op -> ops of the runs it replaced
    fused: dict[str, int] = field(default_factory=dict)  # fused op -> runs replaced
    unmatched: dict[str, str] = field(default_factory=dict)  # fused op -> why a run of its pattern stayed unfused

    def subsumed(self) -> set[str]:
        """Operators whose work some fused node does: swapping one of them leaves the fused kernels behind."""
        return set().union(*self.replaced.values()) if self.replaced else set()


def fusions_of(path: str) -> list[tuple[str, Fusion]]:
    """(operator, fusion) of every fused operator that rewrites ``path``'s graphs, longest pattern first."""
    found = [(name, op.fusion) for name, op in OPERATORS.items() if op.fusion is not None and op.fusion.path == path]
    return sorted(found, key=lambda nf: (-len(nf[1].pattern), nf[0]))


def _scheme_of(node: Node) -> str | None:
    """The weight scheme of a projection node, or of a glue node that reads a projection's record (the lookup of a
    table read from a tied quantized head names it); None for any other node."""
    return OPERATORS[node.op].scheme if node.op in OPERATORS else node.attrs.get("scheme")


def _why_not(nodes: list[Node], f: Fusion, consumers: dict[str, list[int]], start: int,
             graph_outputs: set[str]) -> str | None:
    """None if ``nodes`` (a run starting at index ``start``) matches ``f``, else why not (for reports); "" when the
    operators do not even follow the pattern."""
    for n, want in zip(nodes, f.pattern):
        if want == LINEAR:
            if n.op not in OPERATORS or _scheme_of(n) is None:
                return ""
        elif n.op != want:
            return ""
    layers = {n.layer for n in nodes}
    if (f.scope == LAYER and (None in layers or len(layers) != 1)) or (f.scope == HEAD and layers != {None}):
        return ""
    made = {v for n in nodes for v in n.outputs.values()}
    for n in nodes[1:]:
        if not any(v in made for v in n.inputs.values()):
            return ""
    for n in nodes:
        s = _scheme_of(n)
        if s is not None and s not in f.schemes:
            return f"{n.name} runs {n.op} ({s} weights); it takes {', '.join(f.schemes)}"
        if s is not None and not f.takes_bias and n.attrs.get("bias"):
            return f"{n.name} has a bias; it takes none"
    for key, binding in f.inputs.items():  # what the fused node reads must exist once the run's nodes are gone
        if binding.startswith("@"):
            continue  # the step's state: never made inside a run
        i, role, _ = pattern_binding(binding)
        node = nodes[i]
        if node.op in GLUE and role not in node.inputs and role not in node.weights:
            return ""  # a glue node without what the fused operator binds (the lookup of a float table has no record)
        if node.inputs.get(role) in made:
            return f"{node.name}'s {role} ({key} of the fused operator) is made inside the run"
    bound, end = set(f.outputs.values()), start + len(nodes)
    for j, n in enumerate(nodes):
        for role, v in n.outputs.items():
            used_after = any(c >= end for c in consumers.get(v, ())) or v in graph_outputs
            if used_after and f"{j}.{role}" not in bound:
                return f"{n.name}'s {role} is used after the run and the fused operator does not output it"
    return None


def _fused_node(name: str, f: Fusion, run: list[Node]) -> tuple[Node, dict[str, str]]:
    """The node standing for ``run``, and the graph outputs it adds (new values, e.g. the greedy token)."""
    inputs, weights, attrs, outputs, new = {}, {}, {}, {}, {}

    def lookup(binding: str):
        i, role, fld = pattern_binding(binding)
        node = run[i]
        if fld:
            return "weight", f"{node.weights[role]}#{fld}"
        if role in node.inputs:
            return "value", node.inputs[role]
        if role in node.weights:
            return "weight", node.weights[role]
        raise OperatorError(f"fusion of {name}: pattern node {i} ({node.op}) has no input or weight {role!r}",
                            hint="this is a bug in the fused operator's declaration")

    for key, binding in f.inputs.items():
        if binding.startswith("@"):
            inputs[key] = binding
            continue
        kind, v = lookup(binding)
        (inputs if kind == "value" else weights)[PROJ if key == PROJ else key] = v
    for key, binding in f.attributes.items():
        if binding.startswith("@"):  # a value of the run, not of the graph (graph.executor: RUN_ATTRIBUTES)
            attrs[key] = binding
            continue
        i, attr, _ = pattern_binding(binding)
        attrs[key] = run[i].attrs.get(attr)
    layer = run[0].layer
    full = name if layer is None else f"blocks.{layer}/{name}"
    for key, binding in f.outputs.items():
        if binding.startswith("+"):
            outputs[key] = new[binding[1:]] = f"{full}.{key}"
        else:
            i, role, _ = pattern_binding(binding)
            outputs[key] = run[i].outputs[role]
    return Node(name, full, inputs, outputs, weights, attrs, layer), new


def _consumers(nodes: list[Node]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for v in n.inputs.values():
            out.setdefault(v, []).append(i)
    return out


def _drop_dead(nodes: list[Node], outputs: set[str]) -> list[Node]:
    live, kept = set(outputs), []
    for n in reversed(nodes):
        writes = (n.op in GLUE and GLUE[n.op].side_effect) or any(v in ("@k_cache", "@v_cache") for v in n.inputs.values())
        if writes or any(v in live for v in n.outputs.values()):
            kept.append(n)
            live.update(n.inputs.values())
    return kept[::-1]


def rewrite(graph: Graph, fusions: list[tuple[str, Fusion]], path: str) -> Rewrite:
    """``graph`` with every run matching one of ``fusions`` replaced by its fused operator (tried in order)."""
    nodes = list(graph.nodes)
    outputs = dict(graph.outputs)
    result = Rewrite(graph)
    for name, f in fusions:
        if graph.phase not in f.phases:
            continue
        consumers, out, i, L = _consumers(nodes), [], 0, len(f.pattern)
        while i < len(nodes):
            run = nodes[i:i + L]
            why = _why_not(run, f, consumers, i, set(outputs.values())) if len(run) == L else ""
            if why is None:
                node, new = _fused_node(name, f, run)
                out.append(node)
                outputs.update(new)
                result.fused[name] = result.fused.get(name, 0) + 1
                result.replaced.setdefault(name, set()).update(n.op for n in run if n.op not in GLUE)
                i += L
                continue
            if why:
                result.unmatched.setdefault(name, why)
            out.append(nodes[i])
            i += 1
        nodes = out
    result.graph = graph.with_nodes(_drop_dead(nodes, set(outputs.values())), outputs=outputs, path=path)
    return result
