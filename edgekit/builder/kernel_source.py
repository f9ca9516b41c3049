"""A developer's kernel source file: one operator's Triton kernels, edited outside edgekit, checked against the shipped ABI.

``edgekit plugin pack OP --kernel-source FILE.py`` packs a fixed or faster kernel without rebuilding the
bundle. FILE.py defines the operator the way ``kernels/<op>_triton.py`` does: an ``OpKernels`` object
(usually ``OP = OpKernels(...)``). It is the developer's own file on their build host, imported like any
module they run (never something received over the network); it is imported from its path because Triton
reads a kernel's source from a real file.

The package it becomes is run by devices through the operator's shipped contract, so everything but the
kernel bodies must be what edgekit ships: the same kernels, parameters (names, types, launch expressions,
alignment), constexpr names, precision and launch program. Anything else is refused with what differs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import Mapping, Optional

from edgekit.bundle.keys import SigningKey
from edgekit import __version__
from edgekit.bundle.plugin import PluginMetadata, plugin_from_compiled
from edgekit.bundle.plugin_pack import bundle_plugin_files, check_arch, read_bundle_manifest, sign_package
from edgekit.errors import BundleError, OperatorError
from edgekit.kernels.arch import arch_name
from edgekit.kernels.kernel_def import KernelDef, OpKernels

HOW_TO_START = "start from a copy of edgekit's kernels/{op}_triton.py and change only the kernel bodies"


def load_kernel_source(path: Path, op: str) -> OpKernels:
    """The ``OpKernels`` for ``op`` that FILE.py declares (exactly one), after importing it from its path."""
    path = Path(path)
    if path.suffix != ".py" or not path.is_file():
        raise OperatorError(f"--kernel-source {path}: expected an existing .py file", hint=HOW_TO_START.format(op=op))
    # A name unique to the file's content: editing and re-packing in one process never reuses a stale module.
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    name = f"edgekit_kernel_source_{digest}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and Triton look the module up by name while it executes
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # the developer's code: any exception is a reason to refuse the file
            del sys.modules[name]
            raise OperatorError(f"--kernel-source {path}: importing it failed: {type(e).__name__}: {_first_line(e)}",
                                hint="run `python FILE.py` to see the full error") from e
    declared = [v for v in vars(module).values() if isinstance(v, OpKernels)]
    mine = [k for k in declared if k.op == op]
    if len(mine) != 1:
        found = ", ".join(sorted({k.op for k in declared})) or "none"
        what = "declares no" if not mine else f"declares {len(mine)}"
        raise OperatorError(f"--kernel-source {path} {what} OpKernels for operator {op!r} (it declares: {found})",
                            hint="declare exactly one, e.g. OP = OpKernels(op=...); " + HOW_TO_START.format(op=op))
    return mine[0]


def check_same_abi(candidate: OpKernels, shipped: OpKernels, variants: Mapping, *, source: Path) -> None:
    """Refuse unless ``candidate`` differs from ``shipped`` only in its kernel code (launch program compared at ``variants``)."""
    op = shipped.op
    names, expected = [k.kernel for k in candidate.kernels], [k.kernel for k in shipped.kernels]
    if sorted(names) != sorted(expected):
        _refuse(source, op, "kernels", names, expected)
    mine = {k.kernel: k for k in candidate.kernels}
    for k in shipped.kernels:
        c = mine[k.kernel]
        for field in ("params", "constexpr_names", "fixed", "precision"):  # pdl is a JIT launch switch, not the ABI
            if _plain(getattr(c, field)) != _plain(getattr(k, field)):
                _refuse(source, op, f"{k.kernel}'s {field}", getattr(c, field), getattr(k, field))
        _check_function(c, source)
    if candidate.required != shipped.required:
        _refuse(source, op, "required kernels", candidate.required, shipped.required)
    try:
        program = candidate.program(variants)
    except Exception as e:  # the developer's code
        raise OperatorError(f"--kernel-source {source}: its {op} launch program failed: {type(e).__name__}: {_first_line(e)}",
                            hint=HOW_TO_START.format(op=op)) from e
    if program != shipped.program(variants):
        _refuse(source, op, "launch program", "a different program", "edgekit's (grid, checks, buffers, launches)")


def _check_function(k: KernelDef, source: Path) -> None:
    """The Triton function must take the declared parameters, then the constexprs (the AOT signature is built from them)."""
    args = list(getattr(k.fn, "arg_names", None) or [])
    params = [p.name for p in k.params]
    if not args:
        raise OperatorError(f"--kernel-source {source}: {k.kernel}'s fn is not a @triton.jit function",
                            hint="decorate the kernel with @triton.jit")
    if args[: len(params)] != params or set(args[len(params):]) != set(k.function_constexprs()):
        _refuse(source, k.op, f"{k.kernel}'s function arguments", args, params + list(k.function_constexprs()))


def _plain(value):
    return dict(value) if isinstance(value, Mapping) else value


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else "(no message)"


def _refuse(source: Path, op: str, what: str, got, expected) -> None:
    raise OperatorError(f"--kernel-source {source}: {op}'s {what} differ from edgekit's: got {got!r}, expected {expected!r}",
                        hint="a plugin must keep the operator's ABI (only kernel bodies may change); " + HOW_TO_START.format(op=op))


def pack_from_kernel_source(
    bundle: Path, op: str, source: Path, *, version: int, key: SigningKey, target_arch: Optional[int] = None,
    description: Optional[str] = None, check_numbers: bool = True,
) -> tuple[PluginMetadata, bytes]:
    """A signed package of `op` compiled from a developer's kernel source file, for the device `bundle` serves.

    The tiles are the ones the bundle's (signed) plan chose for `op`, the arch the bundle's, the golden
    vectors the FP64 reference at the bundle's model config and shapes, as the build computes them. With
    ``check_numbers`` (the default) the kernels first run under Triton's CPU interpreter on those golden vectors
    and must meet their tolerances (edgekit.builder.kernel_numbers).
    """
    from edgekit.builder.kernel_numbers import check_kernel_numbers
    from edgekit.builder.pipeline import golden_bytes  # the build's own golden vectors (pipeline imports heavy stages)
    from edgekit.kernels.aot import KernelCompileError, SharedMemoryBudgetError, compile_kernel
    from edgekit.kernels.registry import operator
    from edgekit.kernels.variants import op_program
    from edgekit.plan.document import Plan
    from edgekit.model.weights_file import read_config

    shipped_meta, _ = bundle_plugin_files(bundle, op)  # the bundle ships this op, and its files are intact
    check_arch(bundle, shipped_meta, target_arch)
    plan = Plan.from_dict(read_bundle_manifest(bundle).plan)
    variants = plan.variants(op)
    if not variants:
        raise BundleError(f"{bundle}'s plan chose no kernel variant for {op}", hint="pack from a bundle built with tiles (not --no-tiles)")
    candidate = load_kernel_source(source, op)
    check_same_abi(candidate, operator(op).kernels, variants, source=source)
    by_name = {k.kernel: k for k in candidate.kernels}
    budget = plan.target.smem_budget_bytes
    try:
        compiled = {name: compile_kernel(by_name[name], v, shipped_meta.arch, budget_bytes=budget)
                    for name, v in variants.items()}
    except (KernelCompileError, SharedMemoryBudgetError) as e:  # the kernel, or its tiles on the bundle's target
        raise type(e)(f"--kernel-source {source}: {e.message}", hint=e.hint or "fix the kernel and pack again") from e
    golden = golden_bytes(op, read_config(Path(bundle) / "weights"), plan.static_shapes)
    if check_numbers:  # before anything is signed: a kernel 1% off passed every check a GPU-less host ran
        check_kernel_numbers(bundle, op, source, golden)
    meta, files = plugin_from_compiled(
        op, version, compiled, op_program(op, variants, aot=True), golden,
        description=f"{op} from {Path(source).name} for {arch_name(shipped_meta.arch)}, packed by edgekit {__version__}")
    return sign_package(meta, files, version=version, description=description, key=key)
