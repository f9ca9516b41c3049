"""Fused decode operator: RMSNorm -> packed gate/up projection -> SwiGLU."""

from __future__ import annotations

import torch

from edgekit.errors import OperatorError
from edgekit.kernels import host_checks as hc
from edgekit.kernels.fused_decode_common import (
    FLOAT_DTYPES, FUSED_SCHEMES, fused_precision, golden_norm_input, golden_weight, project, weight_inputs,
    weight_operands, weight_shape,
)
from edgekit.kernels.fusion import Fusion
from edgekit.kernels.operator import DECODE, Operator
from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.kernels.spec import REDUCTION_TOLERANCE, OpSpec, TensorSpec
from edgekit.kernels.swiglu import swiglu_reference


def gate_up_spec(name: str, formula: str) -> OpSpec:
    """The spec of a norm -> packed gate/up GEMV -> gated activation operator (this one, fused_norm_geglu):
    ``formula`` the activation's, in g and u."""
    return OpSpec(
        name=name,
        abi_version=1,
        inputs=(TensorSpec("x", "(B, C)", FLOAT_DTYPES), TensorSpec("norm_weight", "(C,)", FLOAT_DTYPES),
                *weight_inputs("2F", "C", bias=False)),
        outputs=(TensorSpec("y", "(B, F)", FLOAT_DTYPES),),
        attributes=("eps",),
        tolerance=REDUCTION_TOLERANCE,
        doc=f"y = {formula} with [g | u] = rmsnorm(x) @ W.T; W packs the gate rows then the up rows.",
    )


def gate_up_operator(spec: OpSpec, reference, prepare, activation: str) -> Operator:
    """The registry entry of such an operator: the fusion of rmsnorm -> packed gate/up projection (no bias) ->
    ``activation``, the Triton kernels of ``<spec.name>_triton``, this operator's golden call (the same operands)."""
    tile_prefix = spec.name.removeprefix("fused_")
    fusion = Fusion(
        pattern=("rmsnorm", "linear", activation),
        inputs={"x": "0.x", "norm_weight": "0.weight", "proj": "1.proj"},
        attributes={"eps": "0.eps"},
        outputs={"y": "2.y"},
        schemes=FUSED_SCHEMES,
        takes_bias=False,
    )
    return Operator(spec, reference, fused_precision(spec.name), golden_inputs,
                    call_shape=lambda t, a: weight_shape(t), triton=f"{spec.name}_triton:OP",
                    prepare=prepare, tiles_at={f"{tile_prefix}_{f}": DECODE for f in ("fp", "w8", "w4")},
                    fusion=fusion)


SPEC = gate_up_spec("fused_norm_swiglu", "silu(g) * u")


def fused_norm_swiglu_reference(x, norm_weight, weight, scale, offset, eps: float) -> torch.Tensor:
    return swiglu_reference(project(rmsnorm_reference(x, norm_weight, eps), weight, scale, None, offset))


GOLDEN_HALF = 128  # gate rows = up rows; 2 x 128 stays within the golden cap on output rows


def golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    """One decode call: the gate and up rows of W packed as the decoder packs them."""
    C, F = cfg.hidden_size, min(cfg.intermediate_size, GOLDEN_HALF)
    return {**golden_norm_input(cfg, rows, g), **golden_weight(g, 2 * F, C, bias=False)}, {"eps": cfg.rms_norm_eps}


def gate_up_prepare(op: str):
    """The host checks of a norm -> gate/up GEMV -> gated activation call (this operator's, fused_norm_geglu's)."""
    def prepare(x, norm_weight, weight, scale, offset, eps):
        hc.on_cuda(op, ("x", x), ("norm_weight", norm_weight), ("weight", weight), ("scale", scale), ("offset", offset))
        hc.act_dtype(op, x, "x")
        hc.ndim(op, x, "x", 2, "(B, C)")
        hc.unit_last_stride(op, x, "x")
        if weight.dim() != 2 or weight.shape[0] % 2:
            raise OperatorError(f"{op}: weight has shape {tuple(weight.shape)}; expected (2F, C) with gate rows then "
                                f"up rows")
        operands, attrs = weight_operands(op, x, weight, scale, offset, weight.shape[0], x.shape[1])
        hc.same_dtype(op, norm_weight, "norm_weight", x, "x")
        hc.vector(op, norm_weight, "norm_weight", x.shape[1])
        return {"x": x, "norm_weight": norm_weight, **operands}, {"eps": float(eps), **attrs}, lambda bufs: bufs["y"]

    return prepare


prepare = gate_up_prepare(SPEC.name)

OPERATORS = (gate_up_operator(SPEC, fused_norm_swiglu_reference, prepare, "swiglu"),)
