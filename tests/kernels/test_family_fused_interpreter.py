"""The Qwen3 / Gemma 3 fused decode operators' Triton kernels (QK-norm QKV + RoPE + ring-slot cache write, attention
+ o-projection, norm + GeGLU, norm + residual), run by Triton's CPU interpreter, match the FP64 oracle: float, INT8
(W8A16) and INT4 (W4A16) weights, the per-group counters left at zero, only each sequence's cache row written, and
the golden cases a bundle carries (family_fused_interpret_check.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from fused_cases import FAMILY_FUSED_OPS, FAMILY_INT4_OPS  # noqa: E402


def test_family_fused_kernels_under_the_interpreter(interpreter_json):
    results = interpreter_json(Path(__file__).with_name("family_fused_interpret_check.py"))
    cases = [x["case"] for x in results]
    assert sum(" w8a16 B=" in c for c in cases) == 2 * len(FAMILY_INT4_OPS)  # INT8 at two shapes a weight operator
    assert sum(" fp16 B=" in c for c in cases) >= 2 * len(FAMILY_FUSED_OPS)
    assert sum(c.startswith("fused_norm_qkv_qknorm_rope Hq=") for c in cases) == 3  # groups of 1, 2 and 4 heads
    assert sum(" K loop " in c for c in cases) == len(FAMILY_INT4_OPS), cases
    assert sum(" range " in c for c in cases) >= 1, "the large-activation (half2 range) cases did not run"
    assert sum("'group'" in c and " range " not in c for c in cases) >= 3, "the hypothesis-drawn INT4 cases did not run"
    golden = [c for c in cases if c.startswith("golden ")]
    assert {c.split()[1].rsplit("_b", 1)[0] for c in golden} == set(FAMILY_FUSED_OPS), golden
    assert sum(c.endswith("_int4") for c in golden) == len(FAMILY_INT4_OPS)  # every INT4 kernel a plugin ships
    failed = [x for x in results if not all(v <= 1.0 for v in x["ratios"].values())]
    assert not failed, f"outside the FP16 tolerance (ratio = error / allowed; flags are 0/1): {failed}"
