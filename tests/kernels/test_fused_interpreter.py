"""The fused decode operators' Triton kernels, run by Triton's CPU interpreter, match the FP64 oracle.

Covers float and INT8 (W8A16) weights, with and without bias, one and two
sequences, a K loop ending in a partial block, the interleaved RoPE pairs and
the KV-cache write (only the sequence's position changes), SwiGLU's gate/up
interleave and the two-stage argmax (the first maximum).
"""

from __future__ import annotations

from pathlib import Path


def test_fused_kernels_under_the_interpreter(interpreter_json):
    results = interpreter_json(Path(__file__).with_name("fused_interpret_check.py"))
    # 5 operators x {fp16, w8a16} x 2 shapes, + attention over 5-8 splits, + the 5 fused operators' golden cases
    # (FP16 at 1 and 4 sequences, INT8, INT4; the LM head's INT4 case is what an int4-head bundle ships)
    assert len(results) == 22 + 5 * 4
    assert sum(x["case"].endswith(("_int8", "_int4")) for x in results) == 10
    assert any(x["case"].startswith("golden fused_head_argmax") and x["case"].endswith("_int4") for x in results)
    failed = [x for x in results if not all(v <= 1.0 for v in x["ratios"].values())]
    assert not failed, f"outside the FP16 tolerance (ratio = error / allowed; flags are 0/1): {failed}"
