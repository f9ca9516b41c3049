"""Run the decode feedback kernel under Triton's CPU interpreter beside its torch reference; print the states (JSON).

Run by test_decode_feedback.py in a subprocess with TRITON_INTERPRET=1 (set before Triton is imported).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

sys.path.insert(0, str(Path(__file__).parent))
import interpret_check  # noqa: E402,F401  (installs the interpreter shim for NumPy >= 2.4)
import torch  # noqa: E402

from edgekit.kernels.decode_feedback_triton import feedback_reference, feedback_step  # noqa: E402


def main() -> None:
    states = []
    for use_triton in (True, False):
        out = torch.full((3,), -1, dtype=torch.long)
        tokens, positions, count = torch.tensor([7]), torch.tensor([511]), torch.tensor([0])
        step = (lambda *a: feedback_step(*a, use_triton=True)) if use_triton else feedback_reference
        trace = []
        for nxt in torch.randint(0, 49152, (5,), generator=torch.Generator().manual_seed(0)):  # 5 > len(out): wraps
            step(nxt.reshape(1), tokens, positions, count, out)
            trace.append([tokens.tolist(), positions.tolist(), count.tolist(), out.tolist()])
        states.append(trace)
    print(json.dumps({"triton": states[0], "reference": states[1]}))


if __name__ == "__main__":
    main()
