"""The decode paths, as rewrites of the one graph: which operators each path calls, and which a bundle ships.

- ``per-operator``: the base graph with the fusions every path takes (a float QKV projection and its RoPE as one
  ``qkv_rope``). Prefill and the calibration windows always run it; decode falls back to it after a swap.
- ``fused``: the decode graph rewritten by every fused decode operator's pattern (``kernels/fusion.py``) where the
  weights allow, then the per-operator fusions. It exists when at least one run was fused and the KV cache is plain
  FP16/BF16 (the fused operators write it as such).

Everything that asks "which operators run" asks here: the runtime's path choice, the planner's kernel counts and
operator list, the build's compiled set, the golden vectors.
"""

from __future__ import annotations

from functools import lru_cache

from edgekit.graph.builder import LinearSchemes
from edgekit.graph.families import graph_for
from edgekit.graph.glue import GLUE
from edgekit.graph.node import DECODE, PREFILL, Graph
from edgekit.graph.rewrite import Rewrite, fusions_of, rewrite

BASE, PER_OPERATOR, FUSED = "base", "per-operator", "fused"  # BASE: the family's graph as written, no fusion
DECODE_PATHS = (FUSED, PER_OPERATOR)
FUSED_KV_CACHE = ("fp16",)  # the fused operators write the cache in the activation dtype


@lru_cache(maxsize=256)
def path_rewrite(config, schemes: LinearSchemes, phase: str, path: str = PER_OPERATOR) -> Rewrite:
    """The graph ``path`` runs at ``phase`` and what its fusions replaced (cached: configs and schemes are frozen)."""
    fusions = [] if path == BASE else fusions_of(PER_OPERATOR)
    if path == FUSED and phase == DECODE:
        fusions = fusions_of(FUSED) + fusions
    return rewrite(graph_for(config, schemes, phase), fusions, path)


def path_graph(config, schemes: LinearSchemes, phase: str, path: str = PER_OPERATOR) -> Graph:
    return path_rewrite(config, schemes, phase, path).graph


def fused_blocker(config, schemes: LinearSchemes, kv_cache: str = "fp16") -> str | None:
    """Why these weights have no fused decode path (None: they have one)."""
    if kv_cache not in FUSED_KV_CACHE:
        return f"the fused operators write a plain FP16/BF16 KV cache; this one is {kv_cache}"
    r = path_rewrite(config, schemes, DECODE, FUSED)
    if not r.fused:
        reasons = "; ".join(f"{op}: {why}" for op, why in r.unmatched.items()) or "no fused operator matches the graph"
        return f"no fused operator takes these weights ({reasons})"
    return None


def registry_ops(graph: Graph) -> list[str]:
    """The registry operators ``graph`` calls (glue ops left out), in first-call order."""
    return [op for op in graph.operators() if op not in GLUE]


def bundle_operators(config, schemes: LinearSchemes, kv_cache: str = "fp16") -> list[str]:
    """Every operator a bundle of these weights runs, on every path it can take: the prefill's, the per-operator
    decode step's (the fallback after a swap) and the fused step's when there is one. What the plan lists, the build
    compiles and signs, and the golden vectors cover."""
    graphs = [path_graph(config, schemes, PREFILL), path_graph(config, schemes, DECODE)]
    if fused_blocker(config, schemes, kv_cache) is None:
        graphs.append(path_graph(config, schemes, DECODE, FUSED))
    return list(dict.fromkeys(op for g in graphs for op in registry_ops(g)))


def decode_only_operators() -> list[str]:
    """Operators that only a decode step calls (each runs one token per sequence): the fused operators."""
    from edgekit.kernels.registry import OPERATORS

    return [name for name, op in OPERATORS.items() if op.fusion is not None and op.fusion.phases == (DECODE,)]


def fused_operators() -> list[str]:
    """The fused decode operators (every registry operator whose fusion rewrites the fused path)."""
    return [name for name, _ in fusions_of(FUSED)]


def fused_step_operators(config, schemes: LinearSchemes) -> list[str]:
    """The fused operators the fused decode graph of these weights calls."""
    own = set(fused_operators())
    return [op for op in registry_ops(path_graph(config, schemes, DECODE, FUSED)) if op in own]


def swap_sensitive(config, schemes: LinearSchemes) -> set[str]:
    """Operators whose work the fused decode graph's fused nodes do: after a swap of one of them the fused kernels
    still hold the previous version, so decode must leave the fused path. The operators the rewrite replaced, and
    the per-operator path's own fusions of them (``qkv_rope``: the per-operator step calls it, the fused step not)."""
    r = path_rewrite(config, schemes, DECODE, FUSED)
    per_op = set(registry_ops(path_graph(config, schemes, DECODE)))
    return r.subsumed() | (per_op - set(registry_ops(r.graph)))
