"""Kernels one forward pass launches on the target, for the planner's predictions: the graph's count at the plan.

The roofline adds a fixed gap per kernel (launch and drain, even under CUDA-graph
replay), so the count matters at decode, where a 135M model's step is a few
hundred kernels of a few microseconds each. The count walks the path's graph
(``edgekit.graph.launch_count``) on shape-only weights of the plan's weight
schemes, with the plan's tiles and the target's SM count, so conditional launches
(split-K GEMV, the decode reduce) are counted as the device will decide them.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch

from edgekit.graph.launch_count import count_launches
from edgekit.graph.paths import path_graph
from edgekit.kernels.weight_schemes import Grouping
from edgekit.model.config import ModelConfig
from edgekit.model.kv_cache import StaticKVCache
from edgekit.model.weights import empty_weights
from edgekit.plan.precision import PrecisionPlan

Variants = Callable[[str], Mapping]  # op -> {kernel: KernelVariant} the plan chose


def count_pass(cfg: ModelConfig, precision: PrecisionPlan, variants: Variants, *, phase: str, path: str, batch: int,
               tokens: int, context: int, sm_count: int, max_shared_bytes: int) -> dict:
    """Kernels of one pass of ``path``'s graph at ``phase`` ("prefill" of ``tokens``, or "decode"): {"total",
    "per_layer", "outside_layers", "operators" (by registry op), "glue" (torch kernels between operators)}."""
    schemes = precision.linear_schemes()
    weights = empty_weights(cfg, schemes, Grouping(precision.int4_group, precision.int4_group_bytes))
    cache = StaticKVCache(cfg, batch, context, torch.float16, "meta")
    return count_launches(path_graph(cfg, schemes, phase, path), weights, cache, batch=batch, tokens=tokens,
                          sm_count=sm_count, max_shared_bytes=max_shared_bytes, variants=lambda op, facts: variants(op))
