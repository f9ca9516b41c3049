"""Every Triton kernel, run by Triton's CPU interpreter, matches the FP64 oracle within its FP16 tolerance.

The interpreter executes the kernels' own code (masks, loops, online softmax,
the INT8 dequantisation trick, split-KV reduction) with NumPy; it checks
semantics, not speed or GPU code generation (the GPU tests do that).
"""

from __future__ import annotations

from pathlib import Path


def test_triton_kernels_under_the_interpreter(interpreter_json):
    results = interpreter_json(Path(__file__).with_name("interpret_check.py"), timeout=600)
    assert len(results) >= 21  # every op, GEMV (with and without split-K) and GEMM paths, two attention shapes
    assert {"linear_w8a16 split-K M=1", "linear_w8a16 split-K M=3"} <= {x["case"] for x in results}
    failed = [x for x in results if not x["ratio"] <= 1.0]
    assert not failed, f"outside the FP16 tolerance (ratio = error / allowed): {failed}"
