"""geglu: Gemma's gated GELU (tanh) MLP activation, one registry operator (reference against the FP64 oracle in
test_references.py, kernel under the interpreter in test_family_ops_interpreter.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgekit.builder.golden import golden_cases
from edgekit.kernels.aot import compile_variant
from edgekit.kernels.geglu import GELU_TANH_C, GELU_TANH_CUBIC, SPEC, geglu_reference
from edgekit.kernels.registry import OPERATORS
from edgekit.kernels.variants import default_variants
from edgekit.model.presets import preset_config


def test_reference_is_tanh_gelu_of_the_gate_times_up_and_the_sigmoid_form_is_the_same_function():
    gu = torch.randn(3, 2 * 40, dtype=torch.float64) * 4
    gate, up = gu.chunk(2, -1)
    want = F.gelu(gate, approximate="tanh") * up
    assert torch.equal(geglu_reference(gu), want)
    # the kernel's and the ONNX body's form: g * sigmoid(C (g + 0.044715 g^3))
    sigmoid_form = gate * torch.sigmoid(GELU_TANH_C * (gate + GELU_TANH_CUBIC * gate ** 3)) * up
    torch.testing.assert_close(sigmoid_form, want, rtol=1e-12, atol=1e-12)


def test_registered_with_golden_cases():
    op = OPERATORS["geglu"]
    assert op.spec is SPEC and op.kernels.op == "geglu" and op.onnx.op_type == "GeGLU"
    cases = golden_cases("geglu", preset_config("gemma-3-1b"), (16, 64), 128)
    assert [c.meta.name for c in cases] == ["geglu_b16_r16", "geglu_b64_r64"]
    assert cases[1].expected["y"].shape == (64, 6912)


def test_cross_compiles_for_orin_within_the_shared_memory_budget():
    ck = compile_variant(default_variants("geglu")["geglu_fwd"], 87, budget_bytes=128 * 1024)
    assert ck.arch == 87 and ck.shared_bytes <= 128 * 1024 and ck.ptx
