"""Architecture family -> its forward, and ``graph_for``: the only place a model's forward is written.

A family is one function of a ``GraphBuilder`` (``graph/llama.py``, ...). Every
path the model runs is this graph or a rewrite of it (``graph/paths.py``).
"""

from __future__ import annotations

from typing import Mapping

from edgekit.errors import ConfigError
from edgekit.graph.builder import Family, GraphBuilder, LinearSchemes
from edgekit.graph.gemma3 import gemma3
from edgekit.graph.llama import llama
from edgekit.graph.node import Graph
from edgekit.graph.qwen3 import qwen3

FAMILIES: Mapping[str, Family] = {"llama": llama, "mistral": llama, "qwen2": llama, "qwen3": qwen3, "gemma3": gemma3}


def supported_architectures() -> tuple[str, ...]:
    return tuple(FAMILIES)


def family_of(architecture: str) -> str:
    """The graph family an architecture runs as (the function, and module, of its forward): qwen2 -> "llama"."""
    family = FAMILIES.get(architecture)
    if family is None:
        raise ConfigError(f"architecture {architecture!r} has no graph; supported: {', '.join(FAMILIES)}")
    return family.__name__


def graph_for(config, schemes: LinearSchemes, phase: str) -> Graph:
    """The base forward graph of ``config``'s architecture family at ``phase`` (prefill, decode or sequence), with
    each projection on the linear operator of its weight scheme."""
    family = FAMILIES.get(config.architecture)
    if family is None:
        raise ConfigError(f"architecture {config.architecture!r} has no graph; supported: {', '.join(FAMILIES)}")
    b = GraphBuilder(config, schemes, phase, config.architecture)
    return b.build(family(b))
