"""Every operator edgekit knows, collected from the operator modules of this package.

An operator module declares ``OPERATORS = (Operator(...), ...)`` (see
``kernels.operator``); this module imports every module of the package that is
not infrastructure (``INFRASTRUCTURE``) or a Triton companion (``*_triton``,
loaded only when its kernels are needed) and files its operators by name.
A new operator is therefore its module plus its tests: nothing here changes.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from edgekit.errors import OperatorError
from edgekit.kernels.operator import Operator

# Modules of edgekit.kernels that hold machinery, not operators (tests check every other module declares some).
INFRASTRUCTURE = frozenset({
    "abi", "aot", "arch", "dispatch", "fused_decode_common", "fusion", "host_checks", "int4_layout",
    "int8_group_layout", "kernel_def", "launch_rule", "launch_count", "launcher", "operator", "pdl_launch", "precision",
    "program_runner", "registry", "sass_stats", "spec", "triton_backend", "variants", "weight_schemes",
})


def operator_modules() -> list[str]:
    """Names of the modules of edgekit.kernels that declare operators, sorted."""
    here = [Path(__file__).parent]
    return sorted(m.name for m in pkgutil.iter_modules([str(p) for p in here])
                  if m.name not in INFRASTRUCTURE and not m.name.endswith("_triton") and not m.name.startswith("_"))


def _collect() -> dict[str, Operator]:
    found: dict[str, Operator] = {}
    for name in operator_modules():
        module = importlib.import_module(f"edgekit.kernels.{name}")
        for op in getattr(module, "OPERATORS", ()):
            if op.name in found:
                raise OperatorError(f"operator {op.name!r} is declared twice (again in edgekit.kernels.{name})")
            found[op.name] = op
    return found


OPERATORS: dict[str, Operator] = _collect()


def operator(name: str) -> Operator:
    """The registry record of ``name``; OperatorError naming the known operators otherwise."""
    try:
        return OPERATORS[name]
    except KeyError:
        raise OperatorError(f"unknown operator {name!r}; expected one of: {', '.join(sorted(OPERATORS))}") from None


def operator_for_scheme(scheme: str) -> Operator:
    """The linear operator that runs projections stored in ``scheme`` (kernels/weight_schemes.py)."""
    from edgekit.kernels.weight_schemes import scheme as scheme_record

    return operator(scheme_record(scheme).operator)


def with_kernels() -> dict[str, Operator]:
    """Operators that have Triton kernels (the rest run their torch reference everywhere)."""
    return {name: op for name, op in OPERATORS.items() if op.triton is not None}


def fused_operators_taking(scheme: str) -> list[str]:
    """The fused operators whose kernels take projections in weight scheme ``scheme`` (their fusion declarations)."""
    return sorted(op.name for op in OPERATORS.values() if op.fusion is not None and scheme in op.fusion.schemes)
