"""GeGLU activation on a packed gate/up projection: y = gelu_tanh(gate) * up (Gemma's MLP).

gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) = g * sigmoid(2 sqrt(2/pi) (g + 0.044715 g^3)):
the kernel and the ONNX body use the sigmoid form (one exp, no tanh).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from edgekit.kernels.operator import PREFILL, OnnxFunction, OpPrecision, Operator, golden_rand
from edgekit.kernels.precision import accumulate_dtype
from edgekit.kernels.spec import ELEMENTWISE_TOLERANCE, FLOAT_DTYPES, OpSpec, TensorSpec
from edgekit.kernels.swiglu import prepare_gated

SPEC = OpSpec(
    name="geglu",
    abi_version=1,
    inputs=(TensorSpec("gate_up", "(..., 2F)", FLOAT_DTYPES),),
    outputs=(TensorSpec("y", "(..., F)", FLOAT_DTYPES),),
    tolerance=ELEMENTWISE_TOLERANCE,
    doc="gate_up packs [gate | up] along the last axis (gate first); y = gelu_tanh(gate) * up.",
)

GELU_TANH_C = 2.0 * math.sqrt(2.0 / math.pi)  # gelu_tanh(g) = g * sigmoid(C (g + 0.044715 g^3))
GELU_TANH_CUBIC = 0.044715


def geglu_reference(gate_up: torch.Tensor) -> torch.Tensor:
    acc = accumulate_dtype(gate_up.dtype)
    gate, up = gate_up.to(acc).chunk(2, dim=-1)
    return (F.gelu(gate, approximate="tanh") * up).to(gate_up.dtype)


prepare = prepare_gated("geglu")  # SwiGLU's host side: same layout


def golden_inputs(cfg, rows: int, context: int, g: torch.Generator) -> tuple[dict, dict]:
    return {"gate_up": golden_rand(g, rows, 2 * cfg.intermediate_size)}, {}


# -- ONNX fallback body: standard ONNX ops that follow the reference step by step (export/onnx_functions.py
#    builds the model-local FunctionProto from it; ``b`` is its Body builder)


def onnx_geglu(b, i: dict, out: list[str]) -> None:
    gate, up = b("Split", b.f32(i["gate_up"]), axis=-1, n_out=2)  # gate first
    cubic = b("Mul", b("Mul", b("Mul", gate, gate), gate), b.const(GELU_TANH_CUBIC))
    z = b("Mul", b("Add", gate, cubic), b.const(GELU_TANH_C))
    b.like(b("Mul", b("Mul", gate, b("Sigmoid", z)), up), i["gate_up"], out[0])


OPERATORS = (
    Operator(
        SPEC, geglu_reference, OpPrecision("geglu", "none", "fp16", "fp32", "fp16"), golden_inputs,
        triton="geglu_triton:OP", prepare=prepare, tiles_at={"geglu_fwd": PREFILL}, rowwise=True,
        onnx=OnnxFunction("GeGLU", (), onnx_geglu),
    ),
)
