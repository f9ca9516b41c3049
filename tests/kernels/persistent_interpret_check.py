"""Run the persistent decode kernel's staged launches under Triton's CPU interpreter; print the checks (JSON).

Run by test_persistent_interpreter.py in a subprocess with TRITON_INTERPRET=1 (set
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
from persistent_cases import check_layer  # noqa: E402

from edgekit.kernels.triton_backend import triton_ops  # noqa: E402


def main() -> None:
    ops = triton_ops()
    results = []
    for int8 in (False, True):
        for B, bias in ((1, True), (2, False)):
            # S=300: the attention stage splits the cache (3 splits at the interpreter's 8 SMs); C=48: partial K blocks
            r = check_layer(ops, staged=True, B=B, C=48 if B == 2 else 64, F=80, n_heads=4, n_kv_heads=2, head_dim=32,
                            S=300, int8=int8, bias=bias, seed=10 + len(results), device="cpu")
            results.append({"case": f"{'w8a16' if int8 else 'fp16'} B={B} bias={bias}", **r})
    print(json.dumps(results))


if __name__ == "__main__":
    main()
