"""What an operator is, independent of who implements it.

A spec is the contract every implementation (torch reference, Triton kernel,
hot-swapped plugin) must honour: the tensors it takes and returns, the
attributes it needs, its ABI version, and how close to the FP64 reference an
implementation must be for each input dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: str  # symbolic, e.g. "(B, T, C)"
    dtypes: tuple[str, ...]  # e.g. ("float16", "float32", "float64")
    optional: bool = False


@dataclass(frozen=True)
class Tolerance:
    """Allowed |impl - fp64_ref| <= atol + rtol * |fp64_ref|, elementwise."""

    atol: float
    rtol: float


@dataclass(frozen=True)
class OpSpec:
    name: str
    abi_version: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    attributes: tuple[str, ...] = ()
    # keyed by the input activation dtype name
    tolerance: dict[str, Tolerance] = field(default_factory=dict)
    doc: str = ""

    def tolerance_for(self, dtype_name: str) -> Tolerance:
        return self.tolerance[dtype_name]


FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")

# Default per-dtype tolerances against an FP64 reference, for ops whose error
# is dominated by rounding of the output (norms, elementwise ops).
ELEMENTWISE_TOLERANCE = {
    "float64": Tolerance(atol=1e-10, rtol=1e-10),
    "float32": Tolerance(atol=1e-5, rtol=1e-5),
    "float16": Tolerance(atol=2e-3, rtol=2e-3),
    "bfloat16": Tolerance(atol=2e-2, rtol=2e-2),
}

# Reductions over K (matmuls, attention): error grows with the reduction length;
# these hold for K up to ~16k with fp32 accumulation.
REDUCTION_TOLERANCE = {
    "float64": Tolerance(atol=1e-9, rtol=1e-9),
    "float32": Tolerance(atol=1e-4, rtol=1e-4),
    "float16": Tolerance(atol=1e-2, rtol=1e-2),
    "bfloat16": Tolerance(atol=5e-2, rtol=5e-2),
}
