"""What one operator module declares about its operator: the single record every other layer reads.

An operator module (``kernels/<op>.py``) ends with ``OPERATORS = (Operator(...), ...)``.
``kernels.registry`` collects them; the planner, the build, the golden vectors,
the ONNX export and the runtime loop over the registry and keep no table of
their own. Adding an operator is that module (and its ``_triton`` companion
when it has GPU kernels) plus its tests.

The record holds data and small functions of shapes only: it is importable on
a host without Triton (the kernels load on first use of ``Operator.kernels``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from edgekit.kernels.fusion import Fusion
from edgekit.kernels.spec import OpSpec

DECODE, PREFILL = "decode", "prefill"  # the static shape a kernel is tiled at by the planner


@dataclass(frozen=True)
class OpPrecision:
    """Precision of the kernel that runs an operator; written into plans and manifests."""

    op: str
    weights: str
    activations: str
    accumulate: str
    output: str

    def to_dict(self) -> dict:
        return {"op": self.op, "weights": self.weights, "activations": self.activations,
                "accumulate": self.accumulate, "output": self.output}


@dataclass(frozen=True)
class PlannedShape:
    """The static shapes the planner tiles kernels at (one model, one target, one plan).

    ``cfg`` is the model's config (duck-typed: head_dim, n_heads, n_kv_heads, ...).
    ``out_features(op)`` is the narrowest projection that ``op`` runs (its grid is the smallest);
    ``decode_splits(block_n, max_splits)`` is the split count the decode launch rule will compute.
    """

    cfg: Any
    batch: int
    max_bucket: int
    context: int
    sms: int
    want_splits: int
    out_features: Callable[[str], int]
    decode_splits: Callable[[int, int | None], int]

    @property
    def prefill_rows(self) -> int:
        return self.batch * self.max_bucket


# (kernel, PlannedShape) -> (grid size of a variant at the planned shape, programs wanted), or (None, None)
GridRule = Callable[[str, PlannedShape], tuple[Callable | None, int | None]]


def no_grid_rule(kernel: str, at: PlannedShape) -> tuple[None, None]:
    return None, None


@dataclass(frozen=True)
class OnnxFunction:
    """How the operator appears in ONNX: a node ``op_type`` in the edgekit domain (TensorRT plugins match it)
    whose portable fallback is ``body(b, inputs, outputs)``, built from standard ONNX ops with the export's
    Body builder ``b`` (so this module needs no onnx import)."""

    op_type: str
    attributes: tuple[str, ...]  # node attributes the body reads, besides plugin_version/plugin_namespace
    body: Callable[[Any, dict, list[str]], None]


@dataclass(frozen=True)
class Operator:
    spec: OpSpec
    reference: Callable  # the torch reference (CPU, and FP64 for golden vectors)
    precision: OpPrecision
    # (cfg, rows, context, torch.Generator) -> (inputs, attributes) of one golden call at ``rows`` tokens
    golden_inputs: Callable[..., tuple[dict, dict]]
    # (canonical tensors, attrs) of one call -> the shape keywords ``variants.tile_space`` takes
    call_shape: Callable[[Mapping[str, Any], Mapping[str, Any]], dict] = lambda tensors, attrs: {}
    triton: str | None = None  # "<module>:<attr>" of its ``OpKernels`` in edgekit.kernels, imported on first use
    # its kernels' host side: (the reference's arguments) -> (tensors, attrs, finish(buffers)) for the launch program.
    # Here, not in the Triton module, so a device runs compiled plugins without Triton installed (kernels.launcher)
    prepare: Callable[..., tuple[dict, dict, Callable[[dict], Any]]] | None = None
    tiles_at: Mapping[str, str] = field(default_factory=dict)  # kernel -> DECODE | PREFILL
    grid: GridRule = no_grid_rule
    rowwise: bool = False  # each token independent: golden cases cap the rows (more rows repeat the same program)
    decode_case: bool = False  # golden cases add a one-row call (the decode path takes other kernels)
    onnx: OnnxFunction | None = None  # None: not exportable to ONNX (the exported graph never calls it)
    fusion: Fusion | None = None  # a fused operator: the graph nodes it replaces (kernels/fusion.py)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def scheme(self) -> str | None:
        """The weight scheme this linear operator runs (kernels/weight_schemes.py); None for other operators."""
        from edgekit.kernels.weight_schemes import SCHEMES

        return next((s.name for s in SCHEMES.values() if s.operator == self.name), None)

    @property
    def kernels(self):
        """The operator's ``OpKernels`` (imports Triton), or None for an operator without GPU kernels."""
        if self.triton is None:
            return None
        return _load_kernels(self.triton)


_KERNELS: dict[str, Any] = {}


def _load_kernels(where: str):
    if where not in _KERNELS:
        module, attr = where.split(":")
        _KERNELS[where] = getattr(importlib.import_module(f"edgekit.kernels.{module}"), attr)
    return _KERNELS[where]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# -- golden inputs: seeded, FP16 activations as the plugins run them ------------------------------------

GOLDEN_ACT = "float16"
GOLDEN_MAX_N = 256  # output rows of a golden linear call: kernels are generic in N, a full LM head would be tens of MB


def golden_rand(g, *shape: int, std: float = 1.0, dtype=None):
    import torch

    return (torch.randn(*shape, generator=g) * std).to(dtype or getattr(torch, GOLDEN_ACT))
