"""Running a graph: each node's operator called through the dispatch table, in graph order.

``run_graph`` walks the nodes once per forward. A registry operator node is
called with the arguments its spec lists, each found by name among the node's
inputs (values of the graph or the step's ``@state``), its weights (a path of the
model, ``#field`` for one field of a projection record) and its projection record's
fields (``weight``/``qweight``, ``scale``, ``offset``, ``bias``, ``smooth``), then
its attributes; a glue node runs its implementation (``graph.glue``). The
arguments a node takes are worked out once per graph (``_plan``), so a step costs
dictionary lookups, not spec walks.

The context carries everything a forward reads besides the graph: the table, the
weights, the cache, the step's state, the RoPE tables, and two calibration hooks
(a projection's input seen before it runs and its output rewritten after, and a
``kv_transform`` applied to the keys and values attention reads), and for a
prompt prefilled in chunks the cache history its attention reads. A fused node
that does a projection inside its kernel refuses the hooks it cannot honour
(a norm + projection or an attention + projection never makes the projection's
input; no fused output is the projection's alone) rather than feed them the
wrong tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterable, Mapping

import torch

from edgekit.errors import OperatorError
from edgekit.graph.glue import GLUE
from edgekit.graph.node import PROJ, Graph, Node
from edgekit.kernels.registry import operator

# Projection record fields by the operator input names that take them
RECORD_FIELDS = {"weight": "weight", "qweight": "weight", "scale": "scale", "offset": "offset", "bias": "bias",
                  "smooth": "smooth"}
# Attributes whose value is the forward's, not the graph's (a fusion binds them as "@name"): the activation dtype,
# for an operator none of whose inputs carries it (a tied quantized table's lookup)
RUN_ATTRIBUTES = ("@act_dtype",)


def _is_run_attribute(value) -> bool:
    return isinstance(value, str) and value in RUN_ATTRIBUTES

LinearHook = Callable[[Node, Any, torch.Tensor], None]  # (node, projection record, its input x)
LinearOutputHook = Callable[[Node, Any, torch.Tensor], torch.Tensor]  # (node, record, y) -> y to use


def weight_at(weights, path: str, blocks: Mapping[int, Any] | None = None):
    """The tensor or record at ``path`` of ``weights``: "blocks.3.wqkv", "norm", "blocks.3.wqkv#bias" (a record's
    field); ``blocks`` (index -> block weights) stand in for some of the model's."""
    path, _, fld = path.partition("#")
    if path.startswith("blocks."):
        _, i, role = path.split(".", 2)
        i = int(i)
        block = blocks[i] if blocks is not None and i in blocks else weights.blocks[i]
        obj = getattr(block, role)
    else:
        obj = getattr(weights, path)
    return getattr(obj, fld) if fld else obj


@dataclass
class ExecContext:
    phase: str
    ops: Any  # DispatchTable (``get(name)``)
    weights: Any  # ModelWeights (duck-typed: blocks[i].<role>, tok_embeddings, norm, lm_head)
    tables: Callable[[str], tuple[torch.Tensor, torch.Tensor]]  # RoPE table name -> (cos, sin) (S, D/2)
    cache: Any = None  # StaticKVCache (or a subclass); None: nothing is written (a calibration window)
    state: dict[str, torch.Tensor] = field(default_factory=dict)  # "@tokens", "@positions", "@seq_lens"
    blocks: Mapping[int, Any] | None = None  # block index -> weights standing in for the model's own
    kv_transform: Callable | None = None  # (layer, k, v) -> (k, v), before attention reads them
    # A chunk of a longer prompt: attention reads the row's earlier positions it may see (layer -> k, v, read before
    # the chunk's own are written), then the chunk's own K/V
    kv_history: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | None = None
    on_linear_input: LinearHook | None = None
    on_linear_output: LinearOutputHook | None = None
    before_node: Callable[[], None] | None = None  # called before each node runs (a server's admission point)
    around_glue: Callable[[Node], ContextManager] | None = None  # entered around each glue node's torch ops (counting)
    _kv_read: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def weight(self, path: str):
        return weight_at(self.weights, path, self.blocks)

    def run_attribute(self, name: str):
        """The value of a run attribute (``RUN_ATTRIBUTES``) for this forward."""
        if name == "@act_dtype":  # as a decoder reads its activation dtype (model.decoder.Decoder.dtype)
            return str(self.weights.tok_embeddings.dtype).removeprefix("torch.")
        raise OperatorError(f"unknown run attribute {name!r}; expected one of {', '.join(RUN_ATTRIBUTES)}",
                            hint="this is a bug in a fused operator's declaration")

    def state_value(self, name: str, node: Node):
        if name in self.state:
            return self.state[name]
        layer = node.layer
        if name == "@k_cache":
            return self.cache.k[layer]
        if name == "@v_cache":
            return self.cache.v[layer]
        if name in ("@k_read", "@v_read"):  # the cache as attention reads it (dequantized once per layer and step)
            if layer not in self._kv_read:
                self._kv_read[layer] = self.cache.layer(layer)
            return self._kv_read[layer][0 if name == "@k_read" else 1]
        if name == "@split_arrivals":
            return self.cache.split_arrivals[layer]
        if name in ("@cos_table", "@sin_table"):
            return self.tables(node.attrs["rope"])[0 if name == "@cos_table" else 1]
        raise OperatorError(f"{node.name}: unknown step state {name!r}",
                            hint="this is a bug in edgekit: the graph binds state the executor does not provide")


@dataclass(frozen=True)
class _Call:
    node: Node
    glue: bool
    args: tuple[tuple[str, str], ...]  # (kind, key): kind "value" | "state" | "weight" | "field" | "none"
    attrs: tuple
    roles: tuple[str, ...]  # a glue node's input roles; an operator's outputs in spec order
    projection: str | None  # weight path of the node's projection, for the hooks
    is_linear: bool
    run_attrs: bool = False  # some attribute is a run attribute, resolved at each call
    # a fused operator that does a projection: its output is not the projection's alone (the output hook cannot
    # rewrite it), and unless its x is the projection's input, that input stays inside the kernel (a norm's output,
    # an attention's: the input hook cannot see it)
    hooks_refused: tuple[str, ...] = ()


def input_source(node: Node, name: str, optional: bool) -> tuple[str, str]:
    """Where operator input ``name`` of ``node`` comes from: ("value" | "state", value name), ("weight", weight path)
    or ("field", "<projection path>#<record field>"); ("none", "") for an optional input the node does not bind."""
    if name in node.inputs:
        v = node.inputs[name]
        return ("state", v) if v.startswith("@") else ("value", v)
    if name in node.weights:
        return "weight", node.weights[name]
    if PROJ in node.weights and name in RECORD_FIELDS:
        return "field", f"{node.weights[PROJ]}#{RECORD_FIELDS[name]}"
    if optional:
        return "none", ""
    raise OperatorError(f"{node.name}: {node.op} needs input {name!r}, which the node does not bind "
                        f"(inputs {sorted(node.inputs)}, weights {sorted(node.weights)})",
                        hint="this is a bug in the family's graph or a fusion's bindings")


def _plan(graph: Graph) -> list[_Call]:
    cached = graph.__dict__.get("_calls")  # worked out once per graph object
    if cached is not None:
        return cached
    calls = []
    for node in graph.nodes:
        proj = node.weights.get(PROJ)
        if node.op in GLUE:
            args = tuple((("state", v) if v.startswith("@") else ("value", v)) for v in node.inputs.values())
            calls.append(_Call(node, True, args, (), tuple(node.inputs), proj, False))
            continue
        op = operator(node.op)
        spec = op.spec
        args = tuple(input_source(node, t.name, t.optional) for t in spec.inputs)
        attrs = tuple(node.attrs.get(a) for a in spec.attributes)
        run_attrs = any(_is_run_attribute(a) for a in attrs)
        # the hooks see a projection's input x: not a lookup bound to the head's record (token ids), nor a fused
        # operator whose projection's input stays inside its kernel (a norm's output, an attention's)
        fused_projection = op.fusion is not None and op.fusion.projects()
        # len(), not bool(): torch.compile traces this plan on its first run, and the Dynamo of torch 2.11 (the GPU
        # machine's) cannot trace bool() of a tuple, where 2.13's can (versions between were not tried)
        takes_x = len(spec.inputs) > 0 and spec.inputs[0].name == "x" and (
            op.fusion is None or op.fusion.x_is_projection_input())
        is_linear = op.scheme is not None
        refused = ((() if takes_x else ("on_linear_input",)) + (() if is_linear else ("on_linear_output",))
                   if fused_projection else ())
        calls.append(_Call(node, False, args, attrs, tuple(t.name for t in spec.outputs), proj if takes_x else None,
                           is_linear, run_attrs, refused))
    object.__setattr__(graph, "_calls", calls)
    return calls


def _dead_after(calls: list[_Call], keep: frozenset[str]) -> list[tuple[str, ...]]:
    """For each call of a run, the values no later call of the run reads, once it has run (those not in ``keep``):
    what it made that nothing reads, and what it read last."""
    last: dict[str, int] = {}
    for i, call in enumerate(calls):
        for kind, key in call.args:
            if kind == "value":
                last[key] = i
        for name in call.node.outputs.values():
            last.setdefault(name, i)  # made and never read: dead at once
    dead: list[list[str]] = [[] for _ in calls]
    for name, i in last.items():
        if name not in keep:
            dead[i].append(name)
    return [tuple(d) for d in dead]


def run_graph(graph: Graph, ctx: ExecContext, env: dict[str, torch.Tensor] | None = None,
              nodes: Iterable[int] | None = None, keep: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
    """Run ``graph`` (or its nodes at the indices ``nodes``, in order) and return the values by name: every value
    computed, or with ``keep`` only those.

    ``env`` seeds values (a calibration pass starting at block i seeds that block's incoming stream). ``keep`` (names):
    the values the run computes or reads that are not kept are let go after the last node of the run that reads them
    (a seeded one too; a seeded one the run never reads stays). Without it a teacher-forced pass over 8 windows of
    256 tokens holds every layer's intermediates to its end: the quantizer's passes (quant/forward.py) keep only their
    output, and `edgekit build preset:qwen3-0.6b --target orin` peaked at 7.0 GB of RSS on the CPU instead of
    13.2 GB, its bundle byte for byte the same."""
    env = {} if env is None else env
    calls = _plan(graph)
    run = calls if nodes is None else [calls[i] for i in nodes]
    if isinstance(keep, str):
        raise TypeError(f"keep takes value names, e.g. ({keep!r},), not one string")
    dead = _dead_after(run, frozenset(keep)) if keep is not None else None
    for at, call in enumerate(run):
        node = call.node
        if ctx.before_node is not None:
            ctx.before_node()

        def value(kind: str, key: str):
            if kind == "value":
                return env[key]
            if kind == "state":
                return ctx.state_value(key, node)
            if kind in ("weight", "field"):
                return ctx.weight(key)
            return None

        if call.glue:
            ins = {role: value(kind, key) for role, (kind, key) in zip(call.roles, call.args)}
            if ctx.around_glue is None:
                outs = GLUE[node.op].run(ctx, node, ins)
            else:
                with ctx.around_glue(node):
                    outs = GLUE[node.op].run(ctx, node, ins)
        else:
            args = [value(kind, key) for kind, key in call.args]
            if call.hooks_refused and any(getattr(ctx, h) is not None for h in call.hooks_refused):
                raise OperatorError(f"{node.name}: the fused operator {node.op} does {node.weights.get(PROJ)}'s "
                                    f"projection inside one kernel, so the hooks {', '.join(call.hooks_refused)} "
                                    "(calibration, tuning) cannot see its input or rewrite its output",
                                    hint="run calibration and tuning on the per-operator graph (Decoder.prefill / "
                                         "decode), not on the fused decode graph")
            record = ctx.weight(call.projection) if call.projection and (ctx.on_linear_input or ctx.on_linear_output) \
                else None
            if record is not None and ctx.on_linear_input is not None:
                ctx.on_linear_input(node, record, args[0])
            attrs = call.attrs if not call.run_attrs else tuple(
                ctx.run_attribute(a) if _is_run_attribute(a) else a for a in call.attrs)
            result = ctx.ops.get(node.op)(*args, *attrs)
            if not isinstance(result, tuple):
                result = (result,)
            outs = dict(zip(call.roles, result))
            if call.is_linear and record is not None and ctx.on_linear_output is not None:
                outs["y"] = ctx.on_linear_output(node, record, outs["y"])
        for role, name in node.outputs.items():
            env[name] = outs[role]
        if dead is not None:
            for name in dead[at]:
                env.pop(name, None)
    return env


def block_nodes(graph: Graph, start: int, stop: int) -> list[int]:
    """Indices of the nodes of blocks [start, stop), preceded by the nodes before the first block that do not make
    the residual stream (the RoPE rows, sequence lengths): what running from block ``start`` on a given stream needs."""
    first = next(i for i, n in enumerate(graph.nodes) if n.layer is not None)
    stream = graph.streams[0][0]
    prelude = [i for i in range(first) if stream not in graph.nodes[i].outputs.values()]
    return prelude + [i for i, n in enumerate(graph.nodes) if n.layer is not None and start <= n.layer < stop]


def head_nodes(graph: Graph) -> list[int]:
    """Indices of the nodes after the last block (final norm, LM head)."""
    last = max(i for i, n in enumerate(graph.nodes) if n.layer is not None)
    return list(range(last + 1, len(graph.nodes)))
