"""Check a kernel source's numbers before anything is signed: its kernels, run by Triton's CPU interpreter.

`plugin pack --kernel-source` of an rmsnorm whose output was ``* 1.01`` packed (exit 0) and uploaded (200,
probation): on a host without a GPU the golden check runs the operator's torch reference, never the kernel, so
nothing had looked at the kernel's numbers. Here the developer's kernels run, at the bundle's tiles and through
the operator's launch program, on every case of the golden vectors the package ships, under
``TRITON_INTERPRET=1`` (no GPU needed), and are held to the same tolerances a device holds them to. A kernel
outside them is refused, naming the case, the worst element and the two values.

The interpreter must be chosen before Triton is imported, so the check runs in a child process
(``python -m edgekit.builder.interpreted_kernel``); it reads the kernel file, the bundle's plan and the golden
file, and prints one JSON verdict per case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from edgekit.errors import OperatorError

CHECK_TIMEOUT_S = 900.0  # the interpreter runs each program in NumPy: seconds for a norm, minutes for long attention


def check_kernel_numbers(bundle: Path, op: str, source: Path, golden: bytes, *,
                         timeout_s: float = CHECK_TIMEOUT_S) -> list[dict]:
    """Every golden case's verdict for ``source``'s kernels of ``op``; OperatorError if one is outside tolerance
    or the kernels cannot run."""
    with tempfile.TemporaryDirectory(prefix="edgekit-kernel-check-") as d:
        golden_path = Path(d) / "golden.safetensors"
        golden_path.write_bytes(golden)
        argv = [sys.executable, "-m", "edgekit.builder.interpreted_kernel", str(Path(bundle).resolve()), op,
                str(Path(source).resolve()), str(golden_path)]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=d,
                               env={**os.environ, "TRITON_INTERPRET": "1"})
        except subprocess.TimeoutExpired as e:
            raise OperatorError(f"--kernel-source {source}: the interpreter check of {op} took over {timeout_s:.0f} s",
                                hint="check it on a GPU (`edgekit verify --golden-backend gpu` of a bundle built "
                                     "with it), or make the kernel's programs smaller") from e
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        tail = " ".join((r.stderr.strip().splitlines() or ["no output"])[-1].split())
        raise OperatorError(f"--kernel-source {source}: its {op} kernels could not run under Triton's interpreter: "
                            f"{tail}", hint="run the kernel under TRITON_INTERPRET=1 yourself to see the full error")
    verdicts = [json.loads(ln) for ln in lines]
    failed = [v for v in verdicts if not v["ok"]]
    if failed:
        v = failed[0]
        where = (f" at {v['where']}: {float(v['actual']):.6g} instead of {float(v['expected']):.6g}"
                 if v.get("where") and v.get("actual") is not None else "")
        raise OperatorError(
            f"--kernel-source {source}: {op} is wrong in {len(failed)} of {len(verdicts)} golden case(s), run under "
            f"Triton's interpreter; {v['case']}: {v['reason']}{where} (error {float(v['max_ratio'] or 0):.3g}x the "
            f"tolerance)",
            hint="nothing was signed: fix the kernel and pack again")
    return verdicts
