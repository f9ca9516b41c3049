"""The W4A16 GEMV and GEMM, run by Triton's CPU interpreter, match the FP64 oracle (hypothesis-drawn cases).

Covers every GEMV decode (DECODE 3's half2 path through its pure-Triton twin), symmetric and asymmetric weights, FP16 and FP32 scales, groups 32/64/128, FP16 and FP32 activations,
bias or none, ragged N, K shorter than a tile, split-K and GEMV-only programs, and the bundle's golden vectors
(w4a16_interpret_check.py).
"""

from __future__ import annotations

from pathlib import Path


def test_w4a16_kernels_under_the_interpreter(interpreter_json):
    results = interpreter_json(Path(__file__).with_name("w4a16_interpret_check.py"))
    cases = [x["case"] for x in results]
    assert {"gemv split-K M=1", "gemv split-K M=3", "golden linear_w4a16_b1_r1", "golden linear_w4a16_b16_r16"} <= set(cases)
    assert {f"gemv DECODE={d} symmetric={s}" for d in (0, 1, 2, 3, 4) for s in (False, True)} <= set(cases)
    assert {f"gemv DECODE={d} {a} G={g}" for d in (3, 4) for a in ("fp16", "fp32") for g in (32, 128)} <= set(cases)
    assert any(c.startswith("gemv {") for c in cases) and any(c.startswith("gemm {") for c in cases)
    failed = [x for x in results if not x["ratio"] <= 1.0]
    assert not failed, f"outside the tolerance (ratio = error / allowed): {failed}"
