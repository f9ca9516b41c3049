"""When decode runs on the fused path, and when it falls back to the per-operator one.

The fused path is the model's decode graph rewritten by the fused operators'
patterns (``graph.paths``): for a Llama-family model per layer ``fused_norm_qkv_rope``
(RMSNorm -> QKV -> RoPE -> KV-cache write), ``fused_attn_proj_residual`` (split-KV
attention, its combine inside the output projection + residual), ``fused_norm_swiglu``
and ``fused_proj_residual``, then ``fused_head_argmax`` (final norm -> LM head ->
greedy token on the device), replayed as one CUDA graph (``GraphedDecodeStep``).
A table read from a tied INT8/INT4 head is looked up by ``fused_tied_lookup`` (one
kernel where the per-operator path's torch ops launch 3-7).

Every operator is still an entry of the dispatch table, so each one is a
swappable plugin. Once an operator whose work the fused nodes do is replaced (an
over-the-air swap), the fused kernels no longer run what the table says, so
``select_decode_path`` falls back to the per-operator path until fused operators
built with the new operator arrive. The chosen path and the reason are reported
(``edgekit run --json``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch

from edgekit.errors import EdgekitError
from edgekit.graph.paths import (
    DECODE_PATHS, FUSED, PER_OPERATOR, fused_blocker, fused_operators, fused_step_operators, swap_sensitive,
)
from edgekit.kernels.dispatch import DispatchTable
from edgekit.model.decoder import Decoder
from edgekit.model.kv_cache import StaticKVCache
from edgekit.runtime.fused_step import FusedDecoder

# The path taken unless asked otherwise. A persistent decode kernel (one launch per layer, grid barriers) was measured
# slower than these super-operators in every same-run benchmark on the H200 (smollm2-135m fp16 1574 vs 1741 tok/s,
# llama-3.2-1b fp16 806 vs 1097 and 710 vs 1146, int8 1038 vs 1411; 2026-12-01 to 12-03) and was deleted.
DEFAULT_DECODE_PATH = FUSED


@dataclass(frozen=True)
class DecodePath:
    """Which decode path runs and why (what ``run --json`` and the benchmarks report)."""

    name: str  # "fused" | "per-operator"
    reason: str
    launches_per_token: int | None = None  # the fused step's kernel launches (Triton kernels); None if not counted
    # op -> where the fused step's implementation of it comes from: "plugin:vN" (shipped in the bundle) or
    # "triton" (JIT-compiled on the device, the fallback for bundles without them); empty on the per-operator path
    sources: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"path": self.name, "reason": self.reason, "launches_per_token": self.launches_per_token,
                "operator_sources": dict(self.sources)}


def with_fused_kernels(table: DispatchTable, operators: list[str] | None = None) -> DispatchTable:
    """A copy of ``table`` in which every fused decode operator (or those of ``operators``) runs GPU code.

    A bundle ships the step's operators as signed plugins (the planner lists them, the build compiles them), and
    those are kept. Only an operator still on the torch reference (a bundle built before they were shipped, or a
    decoder made without a bundle) is JIT-compiled here with Triton (source "triton"), which needs Triton on the
    device; without it this raises ImportError and decode stays per operator.
    """
    out = table.copy()
    sources = out.sources()
    missing = [op for op in (operators or fused_operators()) if sources.get(op, "reference") == "reference"]
    if missing:
        from edgekit.kernels.triton_backend import triton_ops

        kernels = triton_ops()
        for op in missing:
            out.set(op, kernels[op], source="triton")
    return out


def fused_path_blocker(decoder: Decoder, cache, table: DispatchTable, baseline: Mapping[str, str] | None,
                       allow_cpu: bool = False) -> str | None:
    """Why the fused path cannot run this decoder (None: it can).

    ``allow_cpu``: a CPU decoder may take the path too (its operators are the torch references: the same
    arithmetic, used to test path selection and swaps without a GPU).
    ``baseline`` holds the table's sources when the fused operators were set up (e.g. at bundle open); an
    operator whose work the fused nodes do (``graph.paths.swap_sensitive``) and whose source changed since then
    was swapped.
    """
    if decoder.device.type != "cuda" and not allow_cpu:
        return f"the fused path runs on a CUDA GPU; this decoder is on {decoder.device.type}"
    if type(cache) is not StaticKVCache:
        return f"the fused operators write a plain FP16/BF16 KV cache; this one is a {type(cache).__name__}"
    why_not = fused_blocker(decoder.config, decoder.schemes)
    if why_not is not None:
        return why_not
    sources = table.sources()
    for op in fused_step_operators(decoder.config, decoder.schemes):
        if sources.get(op, "reference") == "reference":
            # e.g. a bundle built before this operator took its weights (INT4 heads were fused on 2026-12-06) run
            # where Triton cannot compile it
            return (f"{op} has no GPU implementation in the table (torch reference): the bundle ships no plugin for "
                    f"it and no Triton JIT compiled one; rebuild the bundle with this edgekit to run the fused path")
    if baseline is not None:
        for op in sorted(swap_sensitive(decoder.config, decoder.schemes)):
            if op in baseline and sources.get(op) != baseline[op]:
                return (f"operator {op} was swapped ({baseline[op]} -> {sources.get(op)}); the fused operators still "
                        f"hold the previous version, so decode runs per operator until fused operators with it arrive")
    return None


def launches_per_token(decoder: Decoder, graph, batch: int = 1, context: int = 256) -> int | None:
    """Kernels one decode step of ``graph`` launches, counted from its operators' launch programs at the JIT's
    default tiles (``graph.launch_count``) on this GPU's SM count; None where Triton (which holds the programs) is
    absent, or off a GPU."""
    if decoder.device.type != "cuda" or not torch.cuda.is_available():
        return None
    try:
        from edgekit.graph.launch_count import count_launches
        from edgekit.kernels.program_runner import device_properties

        meta = decoder.weights.to(device="meta")
        cache = StaticKVCache(decoder.config, batch, context, decoder.dtype, "meta")
        props = device_properties(decoder.device)
        return count_launches(graph, meta, cache, batch=batch, tokens=1, sm_count=props["sm_count"],
                              max_shared_bytes=props["max_shared_bytes"])["total"]
    except ImportError:
        return None


def select_decode_path(decoder: Decoder, cache, baseline: Mapping[str, str] | None = None,
                       prefer: str = DEFAULT_DECODE_PATH, allow_cpu: bool = False, jit: bool = True):
    """(the object whose ``decode`` a graphed step should capture, the DecodePath that says which one it is).

    ``baseline``: the sources of the operators the fused kernels were built with (None: the decoder's table now).
    ``prefer``: "fused" (the default, DEFAULT_DECODE_PATH) or "per-operator"; a path that cannot run falls back to
    the per-operator one and says why.
    ``allow_cpu``: see ``fused_path_blocker``. ``jit``: JIT-compile with Triton the fused operators the table lacks
    (``with_fused_kernels``); without it the path runs only on operators the table already holds (a bundle's plugins).
    """
    if prefer not in DECODE_PATHS:
        raise EdgekitError(f"unknown decode path {prefer!r}; expected one of: {', '.join(DECODE_PATHS)}")
    if prefer == PER_OPERATOR:
        return decoder, DecodePath(PER_OPERATOR, "asked for (decode path per-operator)")
    table = decoder.ops
    own = fused_step_operators(decoder.config, decoder.schemes)
    if decoder.device.type == "cuda" and jit:
        try:
            table = with_fused_kernels(table, own)
        except (ImportError, EdgekitError) as e:  # no Triton JIT on this device: the plugins still run per operator
            return decoder, DecodePath(PER_OPERATOR, f"the fused operators' Triton kernels are unavailable here ({e})")
    base = baseline if baseline is not None else decoder.ops.sources()
    why_not = fused_path_blocker(decoder, cache, table, base, allow_cpu)
    if why_not is not None:
        return decoder, DecodePath(PER_OPERATOR, why_not)
    step = FusedDecoder(decoder, table)
    sources = {op: src for op, src in table.sources().items() if op in own}
    shipped = all(src.startswith("plugin:") for src in sources.values())
    how = "the bundle's signed plugins" if shipped else "JIT-compiled Triton kernels for the operators the bundle lacks"
    return step, DecodePath(FUSED, f"fused super-operators ({how}) replayed as a CUDA graph",
                            launches_per_token(decoder, step.graph, cache.batch, cache.max_seq_len), sources)
