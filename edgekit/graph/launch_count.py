"""Kernels one forward launches, counted by walking its graph: the planner's kernel counts and the runtime's report.

The graph runs on shape-only "meta" tensors through a table whose every entry asks
the operator's launch program which kernels the call launches (``kernels.launch_count``:
the split-K GEMV's second launch, the decode reduce are decided as the device
decides them for the given SM count) and returns the reference's meta outputs; a
glue node's torch kernels are counted as its implementation dispatches them on those
tensors (every aten op that computes, not a view or an allocation), so a glue whose
work depends on its weights (a tied quantized embedding dequantizes the rows it
gathers: 7 kernels for an asymmetric INT4 table and FP16 activations, 1 for a float
table) is counted as it runs. Nothing
is counted twice and nothing is listed by hand: the count is the graph's.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Mapping

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from edgekit.graph.executor import ExecContext, run_graph
from edgekit.graph.glue import GLUE
from edgekit.graph.node import DECODE, Graph
from edgekit.kernels.registry import operator

# (op, the call's shape keywords: Operator.call_shape) -> {kernel: KernelVariant} the call runs
Variants = Callable[[str, Mapping], Mapping]


def default_call_variants(op: str, facts: Mapping) -> Mapping:
    """The variants the JIT path picks for a call of this shape (``kernels.triton_backend``): FP16 activations."""
    from edgekit.kernels.variants import default_variants

    return default_variants(op, **{"dtype": "fp16", **facts})


class _NotKeyed(Exception):
    """A call whose arguments or outputs the memo does not describe: evaluated, never taken from another's."""


def _meta_key(x):
    """What a meta call's count and outputs depend on in an argument: a tensor's layout, any other value itself."""
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.shape), tuple(x.stride()), x.storage_offset(), x.dtype)
    if isinstance(x, (tuple, list)):
        return (type(x).__name__, tuple(_meta_key(v) for v in x))
    if x is None or isinstance(x, (bool, int, float, str)):
        return ("value", type(x).__name__, x)
    raise _NotKeyed  # anything else (none is passed today): the call is evaluated every time


def _layout(x, inputs: tuple):
    """A reference's output as layouts, remade as fresh meta tensors for a repeated call: fresh tensors (no offset into
    a storage, none of the call's inputs returned as is) or tuples of them; anything else is not kept."""
    if isinstance(x, torch.Tensor):
        if x.storage_offset() or any(x is a for a in inputs):
            raise _NotKeyed
        return ("tensor", tuple(x.shape), tuple(x.stride()), x.dtype)
    if isinstance(x, tuple):
        return ("tuple", tuple(_layout(v, inputs) for v in x))
    raise _NotKeyed


def _remake(layout):
    kind, *rest = layout
    if kind == "tensor":
        shape, stride, dtype = rest
        return torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    return tuple(_remake(v) for v in rest[0])


class _CountingTable:
    """A dispatch table whose entries count the kernels each call launches, in call order.

    A model's layers repeat the same calls at the same shapes, and a meta call is slow (the reference's torch
    decompositions, the launch program's checks: ~5 ms): a call seen before in this pass (same operator, same
    argument layouts and values) takes its count and its output layouts from the first one (a 28-layer decode step
    counts ~30 calls instead of ~280)."""

    def __init__(self, variants: Variants, device: Mapping[str, int]):
        self.variants, self.device = variants, device
        self.calls: list[int] = []
        self._seen: dict[tuple, tuple[int, tuple]] = {}

    def get(self, op: str):
        def call(*args):
            try:
                key = (op, tuple(_meta_key(a) for a in args))
            except _NotKeyed:
                key = None
            seen = self._seen.get(key) if key is not None else None
            if seen is not None:
                self.calls.append(seen[0])
                return _remake(seen[1])
            count, out = self._count(op, args)
            self.calls.append(count)
            if key is not None:
                try:
                    self._seen[key] = (count, _layout(out, args))
                except _NotKeyed:
                    pass
            return out

        return call

    def _count(self, op: str, args: tuple) -> tuple[int, object]:
        """(kernels the call launches, the reference's meta outputs)."""
        from edgekit.kernels.launch_count import launched_kernels

        rec = operator(op)
        if rec.kernels is None:  # no GPU kernels: its torch reference runs, counted as one launch (its matmul)
            count = 1
        else:
            from edgekit.kernels.kernel_def import call_act_dtype

            tensors, attrs, _ = rec.kernels.prepare(*args)
            # the variants of the call's activation dtype, as the JIT picks them (a lookup's program checks it)
            variants = self.variants(op, {**rec.call_shape(tensors, attrs), "dtype": call_act_dtype(tensors, attrs)})
            count = len(launched_kernels(op, variants, args, self.device))
        return count, rec.reference(*args)


# aten ops that launch nothing on a GPU beyond what their name says: allocations and metadata-only reshapes that
# torch does not tag as views
_NOT_KERNELS = frozenset({"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::empty_permuted",
                          "aten::new_empty", "aten::new_empty_strided", "aten::resize_", "aten::_unsafe_view",
                          "aten::detach", "aten::alias", "aten::lift_fresh"})


class _GlueKernels(TorchDispatchMode):
    """Counts the GPU kernels of the torch ops a glue node dispatches on meta tensors, by node name (a host-side
    tensor, such as a Python scalar made a tensor to read it back, launches nothing on the device)."""

    def __init__(self):
        super().__init__()
        self.by_node: dict[str, int] = {}
        self._node = None

    @contextmanager
    def around(self, node):
        self._node = node.name
        self.by_node.setdefault(node.name, 0)
        with self:
            yield

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view and func._schema.name not in _NOT_KERNELS and any(
                isinstance(t, torch.Tensor) and t.device.type == "meta" for t in tree_leaves((args, kwargs, out))):
            self.by_node[self._node] += 1
        return out


def count_launches(graph: Graph, weights, cache, *, batch: int, tokens: int, sm_count: int, max_shared_bytes: int,
                   variants: Variants = default_call_variants) -> dict:
    """Kernels of one pass of ``graph`` on ``weights`` and ``cache`` (meta tensors) at ``batch`` x ``tokens`` (1 for a
    decode step): {"total", "per_layer" (block 0's), "outside_layers", "operators" (by registry op), "glue" (torch
    kernels between them)}."""
    table = _CountingTable(variants, {"sm_count": sm_count, "max_shared_bytes": max_shared_bytes})
    rows, half = cache.max_seq_len, cache.k[0].shape[3] // 2  # the RoPE tables cover every position

    def tables(name: str):
        return (torch.empty(rows, half, dtype=torch.float32, device="meta"),) * 2

    if graph.phase == DECODE:
        state = {"@tokens": torch.empty(batch, dtype=torch.long, device="meta"),
                 "@positions": torch.empty(batch, dtype=torch.long, device="meta")}
    else:
        state = {"@tokens": torch.empty(batch, tokens, dtype=torch.long, device="meta"),
                 "@seq_lens": torch.empty(batch, dtype=torch.int32, device="meta")}
    glue = _GlueKernels()
    run_graph(graph, ExecContext(graph.phase, table, weights, tables, cache, state, around_glue=glue.around))
    per_node, calls = [], iter(table.calls)
    for n in graph.nodes:
        per_node.append(glue.by_node[n.name] if n.op in GLUE else next(calls))
    by_op: dict[str, int] = {}
    for n, k in zip(graph.nodes, per_node):
        if n.op not in GLUE:
            by_op[n.op] = by_op.get(n.op, 0) + k
    return {"total": sum(per_node),
            "per_layer": sum(k for n, k in zip(graph.nodes, per_node) if n.layer == 0),
            "outside_layers": sum(k for n, k in zip(graph.nodes, per_node) if n.layer is None),
            "operators": dict(sorted(by_op.items())),
            "glue": sum(k for n, k in zip(graph.nodes, per_node) if n.op in GLUE)}
