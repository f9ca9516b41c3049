"""The GPU dispatch table: every operator served by its Triton kernels (JIT-compiled for the local GPU).

``triton_dispatch_table(variants)`` returns a ``DispatchTable`` whose entries
(source "triton") check their inputs, bring them into the canonical form of
the operator's launch program, and run that program through Triton's JIT.
Variants come from ``variants`` (e.g. a plan's choice) where given, else the
defaults of ``kernels.variants`` for the shapes of the first call and the GPU
it runs on (cached per shape). Programs are the same documents a plugin carries, so the JIT path
exercises the very launch rules shipped to devices.
"""

from __future__ import annotations

import threading
from typing import Iterable, Mapping


from edgekit.errors import OperatorError
from edgekit.kernels.dispatch import DispatchTable
from edgekit.kernels.program_runner import JitLauncher, device_properties, run_program
from edgekit.kernels.registry import OPERATORS
from edgekit.kernels.variants import KernelVariant, default_variants, kernels_of, op_kernels, op_program

VariantChoice = KernelVariant | Mapping[str, KernelVariant] | Iterable[KernelVariant]


def _device_facts(tensors) -> dict:
    """``gpu_tile_facts`` of the GPU a call runs on; none on the CPU (Triton's interpreter)."""
    import torch

    t = next((t for t in tensors.values() if isinstance(t, torch.Tensor) and t.is_cuda), None)
    return {} if t is None else gpu_tile_facts(t.device)


def gpu_tile_facts(device) -> dict:
    """What the default tiles may know of a GPU (kernels/variants.py's shape keywords): on sm_90 and newer its opt-in
    shared memory per block, where the decode attention stages longer key blocks (attention_triton._decode_default,
    measured on an H100). Below sm_90 (an A100; an Orin running the JIT path: 163 KB a block) nothing:
    the defaults keep the orin budget there until measured. With the block's room, its SMs and an SM's shared memory,
    where torch reports it: the decode attention stages as many key blocks as keep its programs in one wave
    (attention_triton.decode_stages, the tile solver's split-KV rule; the SMs are a green context's inside one)."""
    import torch

    props = device_properties(torch.device(device))  # cached a GPU: asked at every operator call
    smem = props["max_shared_bytes"]  # 0 where this torch does not report it
    if props["arch"] < 90 or not smem:
        return {}
    facts = {"shared_bytes_per_block": smem}
    if props.get("shared_bytes_per_sm"):
        facts.update(sms=props["sm_count"], shared_bytes_per_sm=props["shared_bytes_per_sm"])
    return facts


def _facts_key(facts: dict) -> tuple:
    if "rows" in facts:
        # rows only matter through the tile choice: bucket them so each decode/prefill size compiles once
        rows = facts["rows"]
        facts = {**facts, "rows": rows if rows <= 16 else (64 if rows <= 64 else 1 << 20)}
    return tuple(sorted(facts.items()))


def _as_kernel_map(op: str, choice: VariantChoice) -> dict[str, KernelVariant]:
    if isinstance(choice, KernelVariant):
        choice = [choice]
    if isinstance(choice, Mapping):
        return dict(choice)
    out = {}
    for v in choice:
        if v.op != op:
            raise OperatorError(f"variant {v.label()} is for operator {v.op!r}, given for {op!r}")
        out[v.kernel] = v
    return out


class TritonOp:
    """One operator on the Triton JIT path; callable with the reference's arguments."""

    def __init__(self, op: str, variants: Mapping[str, KernelVariant] | None = None):
        self.op = op
        self.kernels = op_kernels()[op]
        self._fixed = dict(variants) if variants else None
        self._programs: dict[tuple, tuple[dict, dict[str, JitLauncher]]] = {}
        self._lock = threading.Lock()

    def _program_for(self, dtype: str, tensors, attrs) -> tuple[dict, dict[str, JitLauncher]]:
        if self._fixed is not None:  # planned variants: no facts to choose by
            key = (dtype, None)
        else:
            facts = {**OPERATORS[self.op].call_shape(tensors, attrs), **_device_facts(tensors)}
            key = (dtype, _facts_key(facts))
        entry = self._programs.get(key)
        if entry is None:
            if self._fixed is not None:
                variants = self._fixed
            else:
                variants = default_variants(self.op, dtype=dtype, **facts)
            if any(v.dtype != dtype for v in variants.values()):
                raise OperatorError(f"{self.op}: planned variants are for {sorted({v.dtype for v in variants.values()})} "
                                    f"activations, the call has {dtype}")
            program = op_program(self.op, variants, aot=False)
            entry = (program, {name: JitLauncher(v) for name, v in variants.items()})
            with self._lock:
                self._programs[key] = entry
        return entry

    def variants_used(self) -> dict[str, str]:
        """kernel -> label of the variant(s) this operator has launched it with so far (a report of what ran)."""
        seen: dict[str, set[str]] = {}
        for _, launchers in list(self._programs.values()):
            for kernel, launcher in launchers.items():
                seen.setdefault(kernel, set()).add(launcher.variant.label())
        return {kernel: " | ".join(sorted(labels)) for kernel, labels in seen.items()}

    def __call__(self, *args):
        tensors, attrs, finish = self.kernels.prepare(*args)
        from edgekit.kernels.kernel_def import call_act_dtype

        program, launchers = self._program_for(call_act_dtype(tensors, attrs), tensors, attrs)
        return finish(run_program(program, tensors, attrs, launchers))


def triton_ops(variants: Mapping[str, VariantChoice] | None = None) -> dict[str, TritonOp]:
    """op name -> TritonOp for every operator that has Triton kernels."""
    variants = variants or {}
    unknown = set(variants) - set(op_kernels())
    if unknown:
        raise OperatorError(f"variants given for unknown operators {sorted(unknown)}; expected {sorted(op_kernels())}")
    return {op: TritonOp(op, _as_kernel_map(op, variants[op]) if op in variants else None) for op in op_kernels()}


def triton_dispatch_table(variants: Mapping[str, VariantChoice] | None = None) -> DispatchTable:
    """A DispatchTable with every operator on its Triton kernels (source "triton")."""
    table = DispatchTable()
    for name, fn in triton_ops(variants).items():
        table.set(name, fn, source="triton")
    return table


__all__ = ["TritonOp", "triton_dispatch_table", "triton_ops", "kernels_of"]
