"""Kernel variants: the tiles, warps and stages the planner chooses among.

A ``KernelVariant`` names one compilable configuration of one Triton kernel of
one operator. The planner asks ``tile_space`` for every candidate, prunes with
``estimate_shared_bytes`` (analytical, instant), and confirms its choice with
``edgekit.kernels.aot.compile_variant`` (the real shared-memory bytes).

Shape keywords understood by ``tile_space`` / ``default_variants`` (others are
ignored, so a planner can pass one bag of shape facts to every op):

- ``head_dim`` (required), ``n_heads``, ``n_kv_heads``   attention, qkv_rope, rope
- ``hidden_size``                                         rmsnorm
- ``rows``                                                tokens per call (B for decode, B*T for prefill):
                                                          picks the GEMV vs GEMM tiles of the linear ops
- ``shared_bytes_per_block``                              the GPU's opt-in limit, where one runs the call (the
                                                          JIT path on sm_90+): defaults may stage more (the
                                                          decode attention's key blocks)
- ``sms``, ``shared_bytes_per_sm``                        with it, where torch reports them: the decode attention's
                                                          stages keep its programs in one wave
- ``act_bytes`` (``default_variants`` adds it)            bytes of one activation element

An operator may need several kernels (``kernels_of``): attention_decode needs
a split and a reduce kernel, linear_w8a8 a quantize and a GEMM kernel, and the
linear ops take a GEMV variant (decode), a GEMM variant (prefill) or both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from edgekit.errors import OperatorError
from edgekit.kernels.kernel_def import ACT_DTYPES, KernelDef, OpKernels


class FrozenConstexprs(Mapping):
    """A read-only, hashable dict of constexpr values (``v.constexprs["BLOCK_M"]`` works as on a dict)."""

    __slots__ = ("_items", "_hash")

    def __init__(self, values: Mapping[str, Any] | None = None):
        items = dict(values or {})
        for k, v in items.items():
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int):
                raise OperatorError(f"constexpr {k!r}={v!r}: expected an integer value keyed by name")
        self._items = dict(sorted(items.items()))
        self._hash = hash(tuple(self._items.items()))

    def __getitem__(self, k: str) -> int:
        return self._items[k]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self) -> str:
        return repr(self._items)


@dataclass(frozen=True)
class KernelVariant:
    op: str  # operator name as in kernels/registry.py, e.g. "attention_prefill"
    kernel: str  # the Triton kernel's identifier within the op, e.g. "attention_prefill_fwd"
    constexprs: Mapping[str, int] = field(default_factory=dict)  # e.g. {"BLOCK_M": 64, "BLOCK_N": 64, "HEAD_DIM": 64}
    num_warps: int = 4
    num_stages: int = 3
    dtype: str = "fp16"  # activation dtype

    def __post_init__(self) -> None:
        if not isinstance(self.constexprs, FrozenConstexprs):
            object.__setattr__(self, "constexprs", FrozenConstexprs(self.constexprs))

    def to_dict(self) -> dict:
        return {"op": self.op, "kernel": self.kernel, "constexprs": dict(self.constexprs),
                "num_warps": self.num_warps, "num_stages": self.num_stages, "dtype": self.dtype}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "KernelVariant":
        try:
            return cls(op=d["op"], kernel=d["kernel"], constexprs=dict(d["constexprs"]), num_warps=int(d["num_warps"]),
                       num_stages=int(d["num_stages"]), dtype=d.get("dtype", "fp16"))
        except (KeyError, TypeError, ValueError) as e:
            raise OperatorError(f"invalid kernel variant {d!r}: {e}",
                                hint="expected keys op, kernel, constexprs, num_warps, num_stages, dtype") from e

    def label(self) -> str:
        cx = ",".join(f"{k}={v}" for k, v in self.constexprs.items())
        return f"{self.kernel}[{cx}] w{self.num_warps} s{self.num_stages} {self.dtype}"


# --------------------------------------------------------------------------- the kernel catalogue
_OPS: dict[str, OpKernels] | None = None


def op_kernels() -> dict[str, OpKernels]:
    """Every operator with Triton kernels -> its OpKernels (imports the Triton modules on first use)."""
    global _OPS
    if _OPS is None:
        from edgekit.kernels.registry import with_kernels

        _OPS = {name: op.kernels for name, op in with_kernels().items()}
    return _OPS


def kernel_def(op: str, kernel: str) -> KernelDef:
    for k in _op(op).kernels:
        if k.kernel == kernel:
            return k
    raise OperatorError(f"operator {op!r} has no kernel {kernel!r}; expected one of {kernels_of(op)}")


def _op(op: str) -> OpKernels:
    ops = op_kernels()
    if op not in ops:
        raise OperatorError(f"no Triton kernels for operator {op!r}; expected one of {sorted(ops)}")
    return ops[op]


def kernels_of(op: str) -> list[str]:
    """The kernel identifiers of an operator, in launch order."""
    return [k.kernel for k in _op(op).kernels]


def shared_memory_ops() -> list[str]:
    """Operators with at least one kernel that stages tiles in shared memory (the ones a budget constrains)."""
    return sorted(name for name, o in op_kernels().items() if any(k.uses_shared_memory for k in o.kernels))


def _check_shape(op: str, shape: dict) -> None:
    needs_head_dim = op in ("attention_prefill", "attention_decode", "qkv_rope", "rope", "qk_norm_rope")
    if needs_head_dim and not shape.get("head_dim"):
        raise OperatorError(f"tile_space({op!r}) needs head_dim=...")


def _variant(k: KernelDef, cand, dtype: str) -> KernelVariant:
    constexprs, warps, stages = cand
    return KernelVariant(op=k.op, kernel=k.kernel, constexprs={**constexprs, **k.fixed}, num_warps=warps,
                         num_stages=stages, dtype=dtype)


def tile_space(op: str, *, head_dim: int | None = None, dtype: str = "fp16", **shape) -> list[KernelVariant]:
    """Every candidate variant of every kernel of ``op`` for these shapes (not yet checked against a budget)."""
    if dtype not in ACT_DTYPES:
        raise OperatorError(f"dtype {dtype!r} is not a kernel activation dtype; expected one of {sorted(ACT_DTYPES)}")
    shape = {**shape, "head_dim": head_dim}
    _check_shape(op, shape)
    out: list[KernelVariant] = []
    for k in _op(op).kernels:
        out.extend(_variant(k, c, dtype) for c in k.space(shape))
    return out


def default_variants(op: str, *, head_dim: int | None = None, dtype: str = "fp16", **shape) -> dict[str, KernelVariant]:
    """A sensible variant for each kernel of ``op``: within 128 KB of shared memory for sm_87. With
    ``shared_bytes_per_block`` (a GPU's opt-in limit: the JIT path on sm_90+) the defaults measured there: a decode
    attention's longer key blocks."""
    shape = {**shape, "head_dim": head_dim, "act_bytes": ACT_DTYPES.get(dtype, 2)}
    _check_shape(op, shape)
    return {k.kernel: _variant(k, k.default(shape), dtype) for k in _op(op).kernels}


def estimate_shared_bytes(v: KernelVariant) -> int:
    """Analytical shared-memory estimate in bytes (tiles x element bytes x pipeline stages).

    Good for pruning; the compiled kernel's ``shared_bytes`` (aot.compile_variant) is the real number.
    """
    k = kernel_def(v.op, v.kernel)
    return int(k.smem_estimate(v.constexprs, v.num_warps, v.num_stages, ACT_DTYPES[v.dtype]))


def precision_of(v: KernelVariant) -> dict[str, str]:
    """{"input", "accumulate", "output"} of a variant (written into plans and plugin metadata)."""
    return kernel_def(v.op, v.kernel).precision_for(v.dtype)


def validate_variant(v: KernelVariant, kernel: KernelDef | None = None) -> KernelDef:
    """The variant's KernelDef (the shipped one unless ``kernel`` is given), after checking its constexprs are exactly the kernel's."""
    k = kernel if kernel is not None else kernel_def(v.op, v.kernel)
    if set(v.constexprs) != set(k.constexpr_names):
        raise OperatorError(f"variant {v.label()}: constexprs {sorted(v.constexprs)} do not match the kernel's "
                            f"{sorted(k.constexpr_names)}")
    for name, value in k.fixed.items():
        if v.constexprs[name] != value:
            raise OperatorError(f"variant {v.label()}: {name} must be {value} for kernel {k.kernel}")
    if v.dtype not in ACT_DTYPES:
        raise OperatorError(f"variant {v.label()}: dtype {v.dtype!r}; expected one of {sorted(ACT_DTYPES)}")
    if v.num_warps not in (1, 2, 4, 8, 16, 32) or not 1 <= v.num_stages <= 8:
        raise OperatorError(f"variant {v.label()}: num_warps must be a power of two <= 32 and num_stages 1..8")
    return k


def op_program(op: str, variants: Mapping[str, KernelVariant], *, aot: bool = True) -> dict:
    """The launch program (kernels/launch_rule.py format) of an operator built from chosen variants.

    With ``aot`` the program also checks at launch the alignment the compiled code assumes.
    """
    from edgekit.kernels.kernel_def import div16_checks
    from edgekit.kernels.launch_rule import validate_program

    o = _op(op)
    for alternatives in o.required:
        if not any(a in variants for a in alternatives):
            raise OperatorError(f"{op}: a variant for {' or '.join(alternatives)} is required; got {sorted(variants)}")
    for name, v in variants.items():
        if v.kernel != name or v.op != op:
            raise OperatorError(f"{op}: variant {v.label()} is filed under {name!r}")
        validate_variant(v)
    doc = o.program(variants)
    if aot:
        launched = {ln["kernel"] for ln in doc["launches"]}
        for k in o.kernels:
            if k.kernel in launched:
                doc["checks"].extend(div16_checks(k))
    arity = {k.kernel: len(k.params) for k in o.kernels}
    return validate_program(doc, arity)
