"""Run a kernel source's kernels under Triton's interpreter on golden cases; one JSON verdict per line.

Usage (edgekit.builder.kernel_numbers starts it, with TRITON_INTERPRET=1 set before Triton loads):
``python -m edgekit.builder.interpreted_kernel BUNDLE OP KERNEL_SOURCE GOLDEN_FILE``. The kernels run at the
tiles the bundle's plan chose, through the launch program and the host-side preparation a device uses.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path


def _shim_interpreter() -> None:
    """Triton 3.6's interpreter converts one-element arrays with int(), which NumPy >= 2.4 refuses for arrays of
    one dimension (a loop over a runtime bound needs it): give its tensors an ``__index__``."""
    import triton.runtime.interpreter as interp

    patch = interp._patch_lang_tensor

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._patch_lang_tensor = patched


def verdicts(bundle: Path, op: str, source: Path, golden: bytes) -> list[dict]:
    import torch

    from edgekit.builder.kernel_source import load_kernel_source
    from edgekit.bundle.golden import check_case, read_golden
    from edgekit.bundle.plugin_pack import read_bundle_manifest
    from edgekit.kernels.program_runner import JitLauncher, run_program
    from edgekit.kernels.registry import OPERATORS
    from edgekit.kernels.variants import op_kernels, op_program, validate_variant
    from edgekit.plan.planner import Plan

    class SourceLauncher(JitLauncher):
        """Launches the developer's kernel (same ABI, checked before) instead of the shipped one."""

        def __init__(self, variant, kdef):
            super().__init__(variant)
            self.kdef = validate_variant(variant, kdef)

    variants = Plan.from_dict(read_bundle_manifest(bundle).plan).variants(op)
    mine = {k.kernel: k for k in load_kernel_source(source, op).kernels}
    launchers = {name: SourceLauncher(v, mine[name]) for name, v in variants.items()}
    program = op_program(op, variants, aot=False)
    shipped, spec = op_kernels()[op], OPERATORS[op].spec

    def run(op_name, inputs, attributes, plugin=None):
        args = [inputs.get(t.name) for t in spec.inputs] + [attributes[a] for a in spec.attributes if a in attributes]
        tensors, attrs, finish = shipped.prepare(*args)
        with torch.no_grad():
            return finish(run_program(program, tensors, attrs, launchers))

    out = []
    for case in read_golden(golden).cases:
        v = check_case(op, case, run)
        out.append({"case": v.case, "ok": v.ok, "reason": v.reason, "max_ratio": _finite(v.max_ratio),
                    "where": v.where, "actual": _finite(v.actual), "expected": _finite(v.expected)})
    return out


def _finite(x):
    return None if x is None else (x if math.isfinite(x) else str(x))


def main(argv: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("run with TRITON_INTERPRET=1 (set before Triton is imported)", file=sys.stderr)
        return 2
    _shim_interpreter()
    bundle, op, source, golden = argv
    for v in verdicts(Path(bundle), op, Path(source), Path(golden).read_bytes()):
        print(json.dumps(v), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
