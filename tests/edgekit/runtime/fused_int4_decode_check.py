"""An INT4 (W4A16) model's fused decode step through the Triton kernels, under Triton's CPU interpreter; prints the
checks (JSON).

Run by test_fused_int4_decode_interpreter.py in a subprocess with TRITON_INTERPRET=1 (set before Triton is
imported). Not a test module itself. The tiny preset (FFN 96) in FP16, every block projection packed INT4 (groups of 32:
QKV symmetric with FP32 scales and its bias, the others with FP16 scales and offsets), the LM head FP16; the
decoder's table is the Triton kernels' table, the path is chosen by ``select_decode_path`` (CPU allowed) and each
step of ``FusedDecoder`` is compared with the per-operator decoder on the torch references (its own cache): greedy
tokens equal, logits within FP16 rounding. What this leaves to the GPU: graph capture and the compiled code.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

sys.path.insert(0, str(Path(__file__).parents[2] / "kernels"))
import interpret_check  # noqa: E402,F401  (installs the interpreter shim for NumPy >= 2.4)
import torch  # noqa: E402

from edgekit.kernels.dispatch import DispatchTable  # noqa: E402
from edgekit.kernels.int4_layout import quantize_int4_rtn  # noqa: E402
from edgekit.kernels.linear import LinearWeights  # noqa: E402
from edgekit.kernels.triton_backend import triton_dispatch_table  # noqa: E402
from edgekit.model.decoder import Decoder  # noqa: E402
from edgekit.model.presets import preset_config  # noqa: E402
from edgekit.model.weights import random_weights  # noqa: E402
from edgekit.runtime.fused_decode import select_decode_path  # noqa: E402


def int4(lw: LinearWeights, symmetric: bool, scale_dtype: torch.dtype) -> LinearWeights:
    qw, s, m = quantize_int4_rtn(lw.weight.float(), 32, symmetric=symmetric, scale_dtype=scale_dtype)
    return LinearWeights("linear_w4a16", qw, lw.bias, s, offset=m)


def main() -> None:
    # the tiny preset with an FFN of 96 (not 160): 3 groups of 32 in the down projection's K, still not a multiple
    # of its K tile (128), and 40% fewer gate/up programs (the slowest operator under the interpreter)
    cfg = dataclasses.replace(preset_config("tiny"), intermediate_size=96)
    w = random_weights(cfg, seed=4, dtype=torch.float16)
    for b in w.blocks:
        b.wqkv = int4(b.wqkv, True, torch.float32)
        b.wo, b.w_gate_up, b.w_down = (int4(lw, False, torch.float16) for lw in (b.wo, b.w_gate_up, b.w_down))
    reference = Decoder(cfg, w, DispatchTable())
    dec = Decoder(cfg, w, triton_dispatch_table())
    prompt = torch.randint(0, cfg.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    lens = torch.tensor([7, 5])
    caches = reference.new_cache(2, 24), dec.new_cache(2, 24)
    step, path = select_decode_path(dec, caches[1], allow_cpu=True)
    reference.prefill(prompt, lens, caches[0])
    reference.prefill(prompt, lens, caches[1])  # the same cache contents: the steps alone are compared
    tokens, positions, steps = torch.tensor([3, 9]), lens.clone(), []
    for _ in range(2):
        want = reference.decode(tokens, positions, caches[0]).float()  # (B, V)
        got = step.decode(tokens, positions, caches[1]).float()
        steps.append({"tokens_equal": bool(torch.equal(step.last_token, want.argmax(-1))),
                      "finite": bool(torch.isfinite(got).all()), "max_abs_err": float((got - want).abs().max()),
                      "max_abs_ref": float(want.abs().max())})
        tokens, positions = want.argmax(-1), positions + 1
    print(json.dumps({"path": path.name, "reason": path.reason, "sources": dict(path.sources), "steps": steps}))


if __name__ == "__main__":
    main()
