"""Fused decode operator: RMSNorm -> packed gate/up projection -> GeGLU (Gemma's MLP input: gelu_tanh(gate) * up)."""

from __future__ import annotations

import torch

from edgekit.kernels.fused_decode_common import project
from edgekit.kernels.fused_norm_swiglu import gate_up_operator, gate_up_prepare, gate_up_spec
from edgekit.kernels.geglu import geglu_reference
from edgekit.kernels.rmsnorm import rmsnorm_reference

SPEC = gate_up_spec("fused_norm_geglu", "gelu_tanh(g) * u")


def fused_norm_geglu_reference(x, norm_weight, weight, scale, offset, eps: float) -> torch.Tensor:
    return geglu_reference(project(rmsnorm_reference(x, norm_weight, eps), weight, scale, None, offset))


prepare = gate_up_prepare(SPEC.name)

OPERATORS = (gate_up_operator(SPEC, fused_norm_geglu_reference, prepare, "geglu"),)
