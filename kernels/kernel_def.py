"""What edgekit knows about each Triton kernel, beside its code.

A ``KernelDef`` ties one ``@triton.jit`` function to: its runtime parameters in
order (with the launch-rule expression that produces each one), its constexpr
meta-parameters, its precision, its tile search space and an analytical
shared-memory estimate. An ``OpKernels`` ties an operator to its kernels, the
program that launches them (``launch_rule``) and the host-side checks that
bring a call's tensors into the canonical form the program expects.

The same definitions feed the JIT path (``triton_backend``), the ahead-of-time
compile (``aot``) and the plugin launcher (``launcher``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

# Activation dtypes the Triton kernels take, and their sizes. FP64 runs only in the torch references.
ACT_DTYPES = {"fp16": 2, "bf16": 2, "fp32": 4}
TORCH_DTYPE_TO_ACT = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32"}
# An operator none of whose tensors is an activation (a table lookup: integer tokens, quantized rows, scales in their
# stored dtype) names its activation dtype in its host step's attributes as ``act_code``, a number a program can check
ACT_CODES = {"fp16": 1, "bf16": 2, "fp32": 3}


def call_act_dtype(tensors, attrs) -> str:
    """The activation dtype ("fp16", ...) of a prepared call: its ``act_code`` attribute, else its first floating
    tensor's dtype."""
    code = attrs.get("act_code")
    if code is not None:
        for name, c in ACT_CODES.items():
            if c == code:
                return name
        from edgekit.errors import OperatorError

        raise OperatorError(f"act_code {code!r} names no activation dtype; expected one of "
                            + ", ".join(f"{c} ({n})" for n, c in ACT_CODES.items()))
    act = next(t for t in tensors.values() if t is not None and t.is_floating_point())
    return TORCH_DTYPE_TO_ACT[str(act.dtype)]


@dataclass(frozen=True)
class Param:
    """One runtime kernel parameter.

    ``type`` is a Triton signature type; ``"*act"`` stands for a pointer to the
    activation dtype of the variant. ``div16`` marks integers the compiled code
    may assume to be multiples of 16 (strides of contiguous rows): the AOT
    compile tells Triton so (vectorised loads), and the program checks it at
    launch so a plugin is never run on data that breaks the assumption.
    """

    name: str
    type: str
    value: Any  # launch-rule expression
    div16: bool = False

    def resolved_type(self, dtype: str) -> str:
        return "*" + dtype if self.type == "*act" else self.type


Candidate = tuple[dict, int, int]  # (constexprs, num_warps, num_stages)


@dataclass(frozen=True)
class KernelDef:
    op: str
    kernel: str
    fn: Any  # triton JITFunction
    params: tuple[Param, ...]
    constexpr_names: tuple[str, ...]
    precision: Mapping[str, str]  # {"input", "accumulate", "output"}; "{act}" is the activation dtype
    uses_shared_memory: bool
    space: Callable[[dict], list[Candidate]]  # shape -> candidates
    default: Callable[[dict], Candidate]  # shape -> the default candidate
    smem_estimate: Callable[[Mapping[str, int], int, int, int], int]  # (constexprs, warps, stages, act bytes)
    fixed: Mapping[str, int] = field(default_factory=dict)  # constexprs implied by the kernel's identity
    # the function ends with a ``PDL: tl.constexpr = 0`` launch switch (kernels/pdl_triton.py): not part of a variant
    # (AOT builds compile it 0), set by the JIT launcher on sm_90+
    pdl: bool = False
    # the function takes a ``STAGES: tl.constexpr = 1`` argument, the variant's num_stages, as its K loop's
    # pipeline depth (``tl.range(..., num_stages=STAGES)``: Triton stages the loop's loads through shared memory by
    # asynchronous copies only where the loop itself carries num_stages, as loops without a tl.dot need)
    loop_stages: bool = False

    def function_constexprs(self) -> tuple[str, ...]:
        """The constexpr arguments of the Triton function after its parameters: the variant's, the loop's pipeline
        depth, then the PDL switch."""
        return self.constexpr_names + (("STAGES",) if self.loop_stages else ()) + (("PDL",) if self.pdl else ())

    def launch_constexprs(self, num_stages: int) -> dict[str, int]:
        """The function constexprs a launch adds to the variant's (the PDL switch is the launcher's)."""
        return {"STAGES": num_stages} if self.loop_stages else {}

    def precision_for(self, dtype: str) -> dict[str, str]:
        return {k: v.format(act=dtype) for k, v in self.precision.items()}

    def signature(self, dtype: str) -> list[tuple[str, str]]:
        return [(p.name, p.resolved_type(dtype)) for p in self.params]


@dataclass(frozen=True)
class OpKernels:
    """An operator's Triton implementation: kernels, launch program and host-side canonicalisation."""

    op: str
    kernels: tuple[KernelDef, ...]
    # variants by kernel name -> program (launch_rule format). Must accept any subset listed in `required`.
    program: Callable[[Mapping[str, Any]], dict]
    # the op's call arguments (as DispatchTable passes them) -> (tensors, attrs, finish(buffers) -> result)
    prepare: Callable[..., tuple[dict, dict, Callable[[dict], Any]]]
    # kernel-name alternatives: each inner tuple needs at least one variant (e.g. ("w8a16_gemv", "w8a16_gemm"))
    required: tuple[tuple[str, ...], ...]


def pow2_at_least(n: int, floor: int = 1) -> int:
    p = floor
    while p < n:
        p *= 2
    return p


def launch_of(kdef: KernelDef, grid: list, when: dict | None = None) -> dict:
    """A program launch entry passing the kernel's parameters in order."""
    entry = {"kernel": kdef.kernel, "grid": grid, "args": [p.value for p in kdef.params]}
    if when is not None:
        entry["when"] = when
    return entry


def div16_checks(kdef: KernelDef) -> list[dict]:
    """Launch-time checks for the integers the compiled code assumes to be multiples of 16."""
    return [
        {"cmp": "multiple_of", "a": p.value, "b": 16,
         "what": f"{kdef.kernel}: {p.name} must be a multiple of 16 (the compiled code assumes aligned rows)"}
        for p in kdef.params if p.div16
    ]


def program_doc(op: str, inputs: list[str], optional: list[str], attrs: list[str], checks: list[dict],
                let: list, buffers: list[dict], launches: list[dict], outputs: list[str]) -> dict:
    return {"format": 1, "op": op, "inputs": inputs, "optional": optional, "attrs": attrs, "checks": checks,
            "let": let, "buffers": buffers, "launches": launches, "outputs": outputs}
