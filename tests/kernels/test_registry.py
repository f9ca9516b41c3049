"""The operator registry: every operator module is found, and each record is complete and consistent."""

from __future__ import annotations

import importlib

import pytest
import torch

from edgekit.errors import ConfigError, OperatorError
from edgekit.kernels.operator import DECODE, PREFILL
from edgekit.kernels.registry import OPERATORS, operator, operator_for_scheme, operator_modules
from edgekit.model.presets import preset_config


def test_every_operator_module_declares_operators_and_nothing_else_does():
    for name in operator_modules():
        module = importlib.import_module(f"edgekit.kernels.{name}")
        assert getattr(module, "OPERATORS", ()), f"edgekit.kernels.{name} is neither infrastructure nor an operator module"
    declared = {op.name for name in operator_modules() for op in importlib.import_module(f"edgekit.kernels.{name}").OPERATORS}
    assert declared == set(OPERATORS)


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_golden_inputs_follow_the_spec_and_run_the_reference(name):
    op = OPERATORS[name]
    cfg = preset_config("tiny")
    inputs, attrs = op.golden_inputs(cfg, 8, 32, torch.Generator().manual_seed(0))
    spec_inputs = {t.name: t for t in op.spec.inputs}
    assert set(inputs) <= set(spec_inputs) and {n for n, t in spec_inputs.items() if not t.optional} <= set(inputs)
    assert set(attrs) == set(op.spec.attributes)
    absent = {n: None for n, t in spec_inputs.items() if t.optional and n not in inputs}  # as golden.run_reference fills them
    out = op.reference(**absent, **inputs, **attrs)
    outs = out if isinstance(out, tuple) else (out,)
    assert len(outs) == len(op.spec.outputs) and all(torch.isfinite(o.float()).all() for o in outs)


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_tiles_at_names_exactly_the_operators_kernels(name):
    op = OPERATORS[name]
    if op.triton is None:
        assert not op.tiles_at
        return
    assert set(op.tiles_at) == {k.kernel for k in op.kernels.kernels}
    assert set(op.tiles_at.values()) <= {DECODE, PREFILL}
    assert op.precision.op == name


def test_schemes_map_to_linear_operators_and_unknown_names_are_refused():
    assert operator_for_scheme("w8a16").name == "linear_w8a16" and operator_for_scheme("fp16").name == "linear"
    with pytest.raises(OperatorError, match="expected one of"):
        operator("no_such_op")
    with pytest.raises(ConfigError, match="w8a8"):
        operator_for_scheme("int3")
