"""Static instruction statistics of a compiled kernel's main loop, from its cubin (no GPU needed).

A memory-bound kernel such as the decode GEMV is only at bandwidth if it issues few enough instructions per
byte it loads; that count can be read off the SASS on any machine. ``loop_stats(cubin)`` disassembles the
cubin with the ``nvdisasm`` bundled with Triton, takes the main loop (the longest code between a label and a
backward branch to it: the K loop of a GEMV) and returns its instruction mix and the widths of its global
loads (``LDG.E.128`` is a 16-byte load). Scripts divide the loop's instruction count by the bytes one
iteration loads per thread to get the instructions per weight byte.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field

from edgekit.errors import OperatorError

_BRANCH = re.compile(r"BRA\s+`\((\.L_x_\d+)\)")
_OPCODE = re.compile(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_.]+)?)")
_LOAD_WIDTH = re.compile(r"^LDG(?:\.[A-Z0-9_]+)*?\.(U8|S8|U16|S16|64|128)(?:\.|$)")


@dataclass(frozen=True)
class LoopStats:
    instructions: int  # SASS instructions in one iteration of the main loop
    mix: dict[str, int]  # opcode (without modifiers) -> count
    global_loads: dict[str, int] = field(default_factory=dict)  # load width in bits ("8", "32", "128") -> count

    def to_dict(self) -> dict:
        return {"instructions": self.instructions, "mix": dict(self.mix), "global_loads": dict(self.global_loads)}


def _nvdisasm() -> str:
    try:
        import triton.backends.nvidia as nv
    except ImportError as e:  # pragma: no cover - triton is a dependency on Linux
        raise OperatorError("reading SASS needs Triton's bundled nvdisasm; Triton is not installed",
                            hint="pip install triton (Linux)") from e
    return os.path.join(os.path.dirname(nv.__file__), "bin", "nvdisasm")


def disassemble(cubin: bytes) -> str:
    """The cubin's SASS as text (``nvdisasm -c``)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        try:
            r = subprocess.run([_nvdisasm(), "-c", path], capture_output=True, text=True, check=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            raise OperatorError(f"nvdisasm could not disassemble a {len(cubin)}-byte cubin: {e}",
                                hint="check that Triton's backends/nvidia/bin/nvdisasm exists and runs") from e
    return r.stdout


def main_loop(sass: str) -> list[str]:
    """The lines of the longest backward-branch loop (label .. branch), or [] for straight-line code.

    The longest, not the innermost: a GEMV's K loop is its big loop, and the other loops (split-K's sum of
    partials, a spin wait) are a few instructions each."""
    lines = sass.splitlines()
    labels = {ln.split(":")[0]: i for i, ln in enumerate(lines) if re.match(r"^\.L_x_\d+:", ln)}
    best: list[str] = []
    for i, ln in enumerate(lines):
        m = _BRANCH.search(ln)
        start = labels.get(m.group(1)) if m else None
        if start is not None and start < i and i + 1 - start > len(best):
            best = lines[start:i + 1]
    return best


def _load_bits(opcode: str) -> str:
    m = _LOAD_WIDTH.match(opcode)
    if not m:
        return "32"
    return {"U8": "8", "S8": "8", "U16": "16", "S16": "16"}.get(m.group(1), m.group(1))


def loop_stats(cubin: bytes) -> LoopStats:
    """Instruction mix and global-load widths of the main loop of ``cubin``."""
    ops: collections.Counter = collections.Counter()
    loads: collections.Counter = collections.Counter()
    for ln in main_loop(disassemble(cubin)):
        m = _OPCODE.search(ln)
        if not m:
            continue
        full = m.group(1)
        base = full.split(".")[0]
        ops[base] += 1
        if base == "LDG":
            loads[_load_bits(full)] += 1
    return LoopStats(sum(ops.values()), dict(ops.most_common()), dict(loads))
