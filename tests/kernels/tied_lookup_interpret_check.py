"""Run fused_tied_lookup's kernels under Triton's CPU interpreter against its reference; print the cases (JSON).

Hypothesis draws the table's format (INT4 with group 32/64/128, symmetric or with offsets, FP16 or FP32 scales;
INT8 with FP32 channel scales; FP16 as stored), its width (a multiple of the group, often not of the program's
columns), the tokens (1-3, repeats allowed), the activation dtype (FP16 or FP32 rows) and Gemma's embedding scale
or none. Every case must equal the reference bit for bit (the kernel rounds where torch's ops round); fixed cases run
each INT4 form (FP16 / FP32 scales, symmetric / offsets) and INT8 whatever was drawn, and a row over several programs
(a narrow BLOCK_C). BF16 rows are not drawn: the interpreter truncates FP32 to BF16 where the GPU rounds (the GPU
test draws them). A failing case fails inside hypothesis, which shrinks it and
prints the smallest failing example on stderr.

Run by test_fused_tied_lookup.py in a subprocess with TRITON_INTERPRET=1 (set before Triton is imported).
Not a test module itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

sys.path.insert(0, str(Path(__file__).parent))
import interpret_check  # noqa: E402,F401  (installs the interpreter shim for NumPy >= 2.4)
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tied_lookup_cases import lookup_case, mismatches  # noqa: E402

from edgekit.kernels.triton_backend import TritonOp  # noqa: E402
from edgekit.kernels.variants import default_variants  # noqa: E402

OP = "fused_tied_lookup"
results: list[dict] = []


def record(name: str, fn, **case) -> None:
    bad = mismatches(fn, **case)
    results.append({"case": name, "mismatches": bad})
    assert bad == 0, f"{name}: {bad} elements differ from the reference"


def main() -> None:
    op = TritonOp(OP)

    @settings(max_examples=int(os.environ.get("TIED_LOOKUP_EXAMPLES", "12")), deadline=None, database=None)
    @given(fmt=st.sampled_from(["int4", "int8", "fp16"]), group=st.sampled_from([32, 64, 128]), groups=st.integers(1, 5),
           symmetric=st.booleans(), scale_dtype=st.sampled_from([torch.float16, torch.float32]),
           tokens=st.integers(1, 3), act=st.sampled_from([torch.float16, torch.float32]),
           row_scale=st.sampled_from([None, 45.25, 0.3]), seed=st.integers(0, 2**16))
    def drawn(fmt, group, groups, symmetric, scale_dtype, tokens, act, row_scale, seed):
        if fmt == "fp16":
            act = torch.float16  # a float table is gathered as stored: its dtype is the rows'
        case = lookup_case(fmt, width=group * groups, group=group, symmetric=symmetric, scale_dtype=scale_dtype,
                           tokens=tokens, seed=seed)
        record(f"{fmt} g{group} x{groups} sym={symmetric} {scale_dtype} B={tokens} {act} scale={row_scale}", op,
               **case, dtype=act, row_scale=row_scale)

    drawn()
    # every INT4 form (scales FP16 / FP32, symmetric / offsets: each kernel branch) and INT8, whatever was drawn
    for scale_dtype in (torch.float16, torch.float32):
        for symmetric in (True, False):
            case = lookup_case("int4", width=96, group=32, symmetric=symmetric, scale_dtype=scale_dtype, tokens=2,
                               seed=3)
            record(f"int4 fixed {scale_dtype} sym={symmetric}", op, **case, dtype=torch.float16, row_scale=0.3)
    record("int8 fixed", op, **lookup_case("int8", width=96, tokens=2, seed=3), dtype=torch.float32, row_scale=None)
    # a row over several programs: BLOCK_C narrowed below the width (the last program past the row's end)
    variants = default_variants(OP, k_in=320)
    narrow = TritonOp(OP, {k: dataclasses.replace(v, constexprs={**v.constexprs, "BLOCK_C": 128})
                           for k, v in variants.items()})
    for fmt in ("int4", "int8", "fp16"):
        case = lookup_case(fmt, width=320, group=32, symmetric=False, scale_dtype=torch.float16, tokens=2, seed=7)
        record(f"{fmt} several programs", narrow, **case, dtype=torch.float16, row_scale=None)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
