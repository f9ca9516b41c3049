"""SwiGLU activation on a packed gate/up projection: y = silu(gate) * up."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgekit.errors import OperatorError
from edgekit.kernels import host_checks as hc
from edgekit.kernels.operator import PREFILL, OnnxFunction, OpPrecision, Operator, golden_rand
from edgekit.kernels.precision import accumulate_dtype
from edgekit.kernels.spec import ELEMENTWISE_TOLERANCE, FLOAT_DTYPES, OpSpec, TensorSpec

SPEC = OpSpec(
    name="swiglu",
    abi_version=1,
    inputs=(TensorSpec("gate_up", "(..., 2F)", FLOAT_DTYPES),),
    outputs=(TensorSpec("y", "(..., F)", FLOAT_DTYPES),),
    tolerance=ELEMENTWISE_TOLERANCE,
    doc="gate_up packs [gate | up] along the last axis (gate first).",
)


def swiglu_reference(gate_up: torch.Tensor) -> torch.Tensor:
    acc = accumulate_dtype(gate_up.dtype)
    gate, up = gate_up.to(acc).chunk(2, dim=-1)
    return (F.silu(gate) * up).to(gate_up.dtype)


def golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    return {"gate_up": golden_rand(g, rows, 2 * cfg.intermediate_size)}, {}


# -- ONNX fallback body: standard ONNX ops that follow the reference step by step (export/onnx_functions.py
#    builds the model-local FunctionProto from it; ``b`` is its Body builder)


def onnx_swiglu(b, i: dict, out: list[str]) -> None:
    gate, up = b("Split", b.f32(i["gate_up"]), axis=-1, n_out=2)  # gate first
    b.like(b("Mul", b("Mul", gate, b("Sigmoid", gate)), up), i["gate_up"], out[0])


def prepare_gated(op: str):
    """The host side of a gated activation over packed [gate | up] rows (SwiGLU's, GeGLU's): (..., 2F) activations
    as (M, 2F) rows; the result (..., F)."""

    def prepare(gate_up: torch.Tensor):
        hc.on_cuda(op, ("gate_up", gate_up))
        hc.act_dtype(op, gate_up, "gate_up")
        if gate_up.shape[-1] % 2:
            raise OperatorError(f"{op}: gate_up has odd width {gate_up.shape[-1]}; expected 2F ([gate | up])")
        g2 = hc.rows(op, gate_up, "gate_up")  # (M, 2F)
        out_shape = (*gate_up.shape[:-1], gate_up.shape[-1] // 2)
        return {"gate_up": g2}, {}, lambda bufs: bufs["y"].view(out_shape)

    return prepare


prepare = prepare_gated("swiglu")


OPERATORS = (
    Operator(
        SPEC, swiglu_reference, OpPrecision("swiglu", "none", "fp16", "fp32", "fp16"), golden_inputs,
        triton="swiglu_triton:OP", prepare=prepare, tiles_at={"swiglu_fwd": PREFILL}, rowwise=True,
        onnx=OnnxFunction("SwiGLU", (), onnx_swiglu),
    ),
)
