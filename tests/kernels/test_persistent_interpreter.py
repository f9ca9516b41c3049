"""The persistent decode kernel's stages, run by Triton's CPU interpreter as one launch per stage, equal the fused
super-operators' kernels bit for bit (output and KV cache) and match the FP64 oracle of the layer.

Float and INT8 (W8A16) weights, one and two sequences, with and without biases, a
cache split in three by the attention stage, a hidden size ending in a partial
K block. The one-launch mode (grid barriers) needs a GPU: test_persistent_gpu.py.
"""

from __future__ import annotations

from pathlib import Path


def test_persistent_stages_under_the_interpreter(interpreter_json):
    results = interpreter_json(Path(__file__).with_name("persistent_interpret_check.py"))
    assert len(results) == 4  # {fp16, w8a16} x 2 shapes
    for x in results:
        assert x["equal_to_fused_operators"] and x["caches_equal"], x
        assert x["oracle_ratio"] <= 1.0, x
