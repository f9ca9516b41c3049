"""Run the fused decode operators' Triton kernels under Triton's CPU interpreter; print error ratios (JSON).

Run by test_fused_interpreter.py in a subprocess with TRITON_INTERPRET=1 (set
before Triton is imported). Not a test module itself.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

sys.path.insert(0, str(Path(__file__).parent))
import interpret_check  # noqa: E402,F401  (installs the interpreter shim for NumPy >= 2.4)
from fused_cases import FUSED_OPS, check_case  # noqa: E402

from edgekit.kernels.triton_backend import triton_ops  # noqa: E402


def main() -> None:
    ops = triton_ops()
    results = []
    for op in FUSED_OPS:
        for int8 in (False, True):
            for B, C, bias in ((1, 64, True), (2, 48, False)):  # C=48: a K loop with a partial block
                # S=300: the split-KV attention splits the cache (3 splits at the interpreter's 8 SMs)
                ratios = check_case(op, ops[op], B=B, C=C, int8=int8, bias=bias, seed=len(results), device="cpu", S=300)
                results.append({"case": f"{op} {'w8a16' if int8 else 'fp16'} B={B} C={C} bias={bias}",
                                "ratios": ratios})
            if op == "fused_attn_proj_residual":
                # 900-1200 keys in 8 splits of 128-256: 5-8 splits hold keys, more than one SPLIT_STEP (4) of the
                # combine's loop over the splits that hold keys
                ratios = check_case(op, ops[op], B=2, C=64, int8=int8, bias=False, seed=len(results), device="cpu",
                                    S=1200, min_seq_len=900)
                results.append({"case": f"{op} {'w8a16' if int8 else 'fp16'} B=2 S=1200", "ratios": ratios})
    # the golden vectors a bundle carries for each fused operator, the LM head's included (FP64 expected outputs;
    # FP16, INT8 and INT4 weights: every kernel a plugin ships), through the kernels as a plugin runs them
    # (spec-order call)
    from edgekit.builder.golden import golden_cases
    from edgekit.bundle.golden import check_case as check_golden
    from edgekit.model.presets import preset_config
    from edgekit.runtime.gpu_runner import call_with_spec_order

    for op in FUSED_OPS:
        for c in golden_cases(op, preset_config("tiny"), buckets=(16,), context=64):
            v = check_golden(op, c, lambda op, inputs, attrs, plugin: call_with_spec_order(ops[op], op, inputs, attrs))
            results.append({"case": f"golden {c.meta.name}", "ratios": {"golden": v.max_ratio if v.ok else float("inf")}})
    print(json.dumps(results))


if __name__ == "__main__":
    main()
