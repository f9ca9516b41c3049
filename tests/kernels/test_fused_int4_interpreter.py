"""The fused decode operators' INT4 (W4A16) kernels, run by Triton's CPU interpreter, match the FP64 oracle.

Hypothesis-drawn cases (fused_int4_interpret_check.py) over the five fused operators (the LM head's included),
group size 32/64/128, symmetric and offset forms, FP16 and FP32 scales, one or two sequences, K a multiple of the
group but not of the tile, bias or none; FP16 activations up to 8000 in magnitude with the worst sign pattern (the
half2 decode's range, at the operators' own tolerance); fixed cases run K loops of several steps (a group spanning
steps, a last step past K). FP16 activations run the half2 decode's pure-Triton twin here (the interpreter runs no inline PTX).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from fused_cases import INT4_OPS  # noqa: E402


def test_fused_int4_kernels_under_the_interpreter(interpreter_json):
    results = interpreter_json(Path(__file__).with_name("fused_int4_interpret_check.py"))
    cases = [x["case"] for x in results]
    assert sum(" K loop " in c for c in cases) == 2 * len(INT4_OPS), cases
    assert sum(" range " in c for c in cases) >= 4, "the large-activation (half2 range) cases did not run"
    assert len(results) > 2 * len(INT4_OPS) + 4, "the hypothesis-drawn cases did not run"
    failed = [x for x in results if not all(v <= 1.0 for v in x["ratios"].values())]
    assert not failed, f"outside the FP16 tolerance (ratio = error / allowed; flags are 0/1): {failed}"
