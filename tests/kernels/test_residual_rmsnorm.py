"""residual_rmsnorm: the operator added as one module (+ its Triton companion) and these tests.

Nothing else in edgekit names it: the registry finds it, golden vectors, the JIT
backend, the AOT compile and the launch counter take it from its declaration.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from edgekit.builder.golden import golden_cases
from edgekit.kernels.aot import compile_variant
from edgekit.kernels.launch_count import launched_kernels
from edgekit.kernels.registry import OPERATORS
from edgekit.kernels.residual_rmsnorm import SPEC, residual_rmsnorm_reference
from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.kernels.variants import default_variants, op_program
from edgekit.model.presets import preset_config


def _within(got: torch.Tensor, want: torch.Tensor, dtype: str) -> bool:
    tol = SPEC.tolerance_for(dtype)
    return bool(((got.double() - want.double()).abs() <= tol.atol + tol.rtol * want.double().abs()).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_reference_equals_the_unfused_add_then_rmsnorm_and_fp64(dtype):
    g = torch.Generator().manual_seed(1)
    x, r = torch.randn(5, 96, generator=g).to(dtype), torch.randn(5, 96, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(96, generator=g)).to(dtype)
    y, s = residual_rmsnorm_reference(x, r, w, 1e-5)
    assert torch.equal(s, x + r)  # the decoder's own residual add, bit for bit
    assert torch.equal(y, rmsnorm_reference(x + r, w, 1e-5))
    y64, s64 = residual_rmsnorm_reference(x.double(), r.double(), w.double(), 1e-5)
    name = str(dtype).removeprefix("torch.")
    assert _within(s, s64, name) and _within(y, y64, name)


def test_registered_with_golden_cases_and_one_launch():
    op = OPERATORS["residual_rmsnorm"]
    assert op.spec is SPEC and op.kernels.op == "residual_rmsnorm"
    cfg = preset_config("tiny")
    cases = golden_cases("residual_rmsnorm", cfg, (16, 64), 128)
    assert [c.meta.name for c in cases] == ["residual_rmsnorm_b16_r16", "residual_rmsnorm_b64_r64"]
    assert set(cases[0].expected) == {"y", "s"} and cases[0].expected["y"].dtype == torch.float64
    v = default_variants("residual_rmsnorm", hidden_size=cfg.hidden_size)
    args = tuple(torch.empty(3, cfg.hidden_size, dtype=torch.float16, device="meta") for _ in range(2))
    args += (torch.empty(cfg.hidden_size, dtype=torch.float16, device="meta"), 1e-5)
    assert launched_kernels("residual_rmsnorm", v, args, {"sm_count": 16, "max_shared_bytes": 166912}) == \
        ["residual_rmsnorm_fwd"]


def test_cross_compiles_for_orin_within_the_shared_memory_budget():
    v = default_variants("residual_rmsnorm", hidden_size=2048)
    ck = compile_variant(v["residual_rmsnorm_fwd"], 87, budget_bytes=128 * 1024)
    assert ck.arch == 87 and ck.shared_bytes <= 128 * 1024 and ck.ptx
    program = op_program("residual_rmsnorm", v, aot=True)
    assert program["outputs"] == ["y", "s"] and [ln["kernel"] for ln in program["launches"]] == ["residual_rmsnorm_fwd"]


_INTERPRET = """
import json, sys, torch
sys.path.insert(0, {here!r})
import interpret_check  # noqa: F401  (the interpreter shim)
from edgekit.kernels.residual_rmsnorm import residual_rmsnorm_reference
from edgekit.kernels.triton_backend import TritonOp
torch.manual_seed(0)
x, r = torch.randn(3, 4, 80, dtype=torch.float16), torch.randn(3, 4, 80, dtype=torch.float16)
w = torch.randn(80, dtype=torch.float16)
y, s = TritonOp("residual_rmsnorm")(x, r, w, 1e-5)
y64, s64 = residual_rmsnorm_reference(x.double(), r.double(), w.double(), 1e-5)
print(json.dumps({{"s_equal": bool(torch.equal(s, x + r)), "y_err": float((y.double() - y64).abs().max()),
                   "y_scale": float(y64.abs().max())}}))
"""


def test_triton_kernel_under_the_interpreter_matches_fp64(interpreter_json):
    out = interpreter_json(_INTERPRET.format(here=str(Path(__file__).parent)), code=True, timeout=300)
    tol = SPEC.tolerance_for("float16")
    assert out["s_equal"] and out["y_err"] <= tol.atol + tol.rtol * out["y_scale"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_onnx_function_matches_the_reference_in_onnxruntime(dtype):
    sys.path.insert(0, str(Path(__file__).parents[1] / "export"))
    from test_onnx_functions import assert_matches, run_op

    g = torch.Generator().manual_seed(2)
    x, r = torch.randn(2, 3, 64, generator=g).to(dtype), torch.randn(2, 3, 64, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(64, generator=g)).to(dtype)
    y, s = run_op("residual_rmsnorm", {"x": x, "residual": r, "weight": w}, eps=1e-5)
    want_y, want_s = residual_rmsnorm_reference(x, r, w, 1e-5)
    assert_matches("residual_rmsnorm", s, want_s)
    assert_matches("residual_rmsnorm", y, want_y)
