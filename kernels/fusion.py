"""What a fused operator replaces: a pattern of graph nodes and how its inputs come out of them.

A fused operator's module declares ``Fusion(...)`` in its registry record; the
graph's rewriter (``edgekit/graph/rewrite.py``) finds each run of nodes that
matches the pattern and replaces it with one node of the fused operator. Nothing
else keeps a list of what a fused operator subsumes.

Bindings name where each input, attribute and output of the fused operator comes
from, in the pattern's terms:

- ``"2.x"``: the value or weight bound to role ``x`` of pattern node 2;
- ``"2.proj#weight"``: one field of node 2's projection record (``LinearWeights.weight``);
- ``"@k_cache"``: the step's state (see ``edgekit/graph/node.py``);
- for outputs, ``"3.y"`` means the fused output stands for the value node 3 defined as ``y``, and ``"+token"`` a
  new value the pattern did not have (the fused head's greedy token).

Pattern entries are operator names; ``"linear"`` matches a projection of any weight scheme in ``schemes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

LINEAR = "linear"  # in a pattern: a projection node of any of the fusion's schemes
LAYER, HEAD = "layer", "head"  # where a pattern may match: inside a block, or after the blocks


@dataclass(frozen=True)
class Fusion:
    pattern: tuple[str, ...]
    inputs: Mapping[str, str]  # fused operator input (or "proj": its projection record) -> binding
    outputs: Mapping[str, str]  # fused operator output -> binding
    attributes: Mapping[str, str] = field(default_factory=dict)  # fused operator attribute -> "i.attr"
    schemes: tuple[str, ...] = ("fp16",)  # weight schemes its projection may have (kernels/weight_schemes.py)
    phases: tuple[str, ...] = ("decode",)  # graph phases it applies to
    scope: str = LAYER  # LAYER | HEAD
    takes_bias: bool = True  # False: a projection with a bias keeps the unfused nodes
    path: str = "fused"  # the decode path whose graph it rewrites ("per-operator": every path's)

    def __post_init__(self):
        if self.scope not in (LAYER, HEAD):
            raise ValueError(f"fusion scope {self.scope!r}: expected {LAYER!r} or {HEAD!r}")

    def projects(self) -> bool:
        """Whether the fused operator does a projection: its ``proj`` is bound to a ``linear`` node of the pattern
        (a tied table's lookup binds the head's record to an ``embed`` node: no projection runs there)."""
        proj = self.inputs.get("proj")
        if proj is None or proj.startswith("@"):
            return False
        i, role, _ = pattern_binding(proj)
        return role == "proj" and self.pattern[i] == LINEAR

    def x_is_projection_input(self) -> bool:
        """Whether the fused operator's ``x`` is what its projection multiplies (``x`` and ``proj`` of one pattern
        node): then the calibration hooks may see it. A norm + projection operator takes the norm's input and never
        makes the projection's; an attention + projection operator takes no ``x`` at all."""
        x = self.inputs.get("x")
        if not self.projects() or x is None or x.startswith("@"):
            return False
        i, role, _ = pattern_binding(x)
        return role == "x" and i == pattern_binding(self.inputs["proj"])[0]


def pattern_binding(binding: str) -> tuple[int, str, str]:
    """``"i.role"`` or ``"i.role#field"`` -> (i, role, field or ""): a binding to pattern node i (not the step's
    ``@state`` nor a ``+new`` output, which name no node)."""
    i, _, rest = binding.partition(".")
    role, _, fld = rest.partition("#")
    return int(i), role, fld
