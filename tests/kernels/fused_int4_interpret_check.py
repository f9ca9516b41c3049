"""Run the fused decode operators' INT4 (W4A16) kernels under Triton's CPU interpreter; print error ratios (JSON).

Hypothesis draws the operator, group size (32/64/128), symmetric or offset form, FP16 or FP32 scales, batch,
K (a multiple of the group, often not of the tile) and bias; a second draw adds FP16 activations of large
magnitude (up to 8000, the half2 decode's range) with the worst sign pattern; fixed cases add K loops of several
steps (a group spanning steps, a last step ending inside the tile) through variants with a narrow BLOCK_K. The oracle multiplies
by the FP64 dequantization of the packed weights (fused_cases.py). A case outside the tolerance fails inside
hypothesis, which shrinks it and prints the smallest failing example on stderr.

Run by test_fused_int4_interpreter.py in a subprocess with TRITON_INTERPRET=1 (set before Triton is imported).
Not a test module itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

sys.path.insert(0, str(Path(__file__).parent))
import interpret_check  # noqa: E402,F401  (installs the interpreter shim for NumPy >= 2.4)
import torch  # noqa: E402
from fused_cases import INT4_OPS, check_case  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from edgekit.kernels.triton_backend import TritonOp, triton_ops  # noqa: E402
from edgekit.kernels.variants import default_variants  # noqa: E402

results: list[dict] = []
HEADS = dict(n_heads=4, n_kv_heads=2, head_dim=32)  # attention's K = n_heads * head_dim = 128


def record(name: str, fn, op: str, **case) -> None:
    ratios = check_case(op, fn, device="cpu", int8=False, **case)
    results.append({"case": name, "ratios": ratios})
    assert all(v <= 1.0 for v in ratios.values()), f"{name}: error / allowed = {ratios}"


def narrow_k(op: str, block_k: int, **facts):
    """The operator on its default variants, the INT4 kernel's BLOCK_K narrowed to ``block_k`` (a K loop of steps)."""
    variants = default_variants(op, **facts)
    w4 = next(k for k in variants if k.endswith("_w4"))
    variants[w4] = dataclasses.replace(variants[w4], constexprs={**variants[w4].constexprs, "BLOCK_K": block_k})
    return TritonOp(op, variants)


def main() -> None:
    ops = triton_ops()

    @settings(max_examples=int(os.environ.get("FUSED_INT4_EXAMPLES", "5")), deadline=None, database=None)
    @given(op=st.sampled_from(INT4_OPS), group=st.sampled_from([32, 64, 128]), groups=st.integers(1, 3),
           symmetric=st.booleans(), scale_dtype=st.sampled_from([torch.float16, torch.float32]), B=st.integers(1, 2),
           bias=st.booleans(), seed=st.integers(0, 2**16))
    def drawn(op, group, groups, symmetric, scale_dtype, B, bias, seed):
        w4 = {"group": group, "symmetric": symmetric, "scale_dtype": scale_dtype}
        C = group * groups  # the reduction of every op but attention's (n_heads * head_dim = 128: group 32-128)
        record(f"{op} {w4} B={B} C={C} bias={bias}", ops[op], op, B=B, C=C, bias=bias, seed=seed, S=300, w4=w4,
               F=40, N=48, **HEADS)

    drawn()

    # the half2 decode's range (FP16 activations, kernels/int4_half2_triton.py): activations up to 8000 in
    # magnitude (the 1/16 prescale keeps an FP16 lane of 16 products finite below 8188), every row's first
    # sub-block at one sign against codes 0 (a lane's largest partial); group scales divided by the magnitude, so
    # outputs stay O(1) and the FP16 tolerance is the operator's own
    @settings(max_examples=int(os.environ.get("FUSED_INT4_RANGE_EXAMPLES", "4")), deadline=None, database=None)
    @given(op=st.sampled_from(INT4_OPS), group=st.sampled_from([32, 64, 128]), groups=st.integers(1, 2),
           symmetric=st.booleans(), scale_dtype=st.sampled_from([torch.float16, torch.float32]),
           act_range=st.sampled_from([64.0, 1024.0, 4096.0, 8000.0]), seed=st.integers(0, 2**16))
    def wide(op, group, groups, symmetric, scale_dtype, act_range, seed):
        w4 = {"group": group, "symmetric": symmetric, "scale_dtype": scale_dtype}
        record(f"{op} range |x| <= {act_range} {w4} C={group * groups}", ops[op], op, B=1, C=group * groups,
               bias=False, seed=seed, S=300, w4=w4, F=40, N=48, act_range=act_range, **HEADS)

    wide()

    # K loops of several steps: C = 160 (5 sub-blocks) in steps of 64 (the last step half past K), groups of 32
    # and of 128 (a group spanning steps); attention's K = 128 in steps of 32 with groups of 64. QKV runs them on
    # half the heads (2 query heads, 1 KV head: still GQA, q, k and v rows, every rotation pair): the K loop is
    # each program's own, and 8 heads x 8 pair tiles (64 programs a sequence) made the slowest half of this check.
    # Two sequences (the second program axis, ragged attention lengths) in the first form, one in the second
    for op in INT4_OPS:
        heads = dict(HEADS, n_heads=2, n_kv_heads=1) if op == "fused_norm_qkv_rope" else HEADS
        for group, symmetric, sd, B in ((32, False, torch.float16, 2), (128, True, torch.float32, 1)):
            C = 160 if group == 32 else 256
            block_k = 32 if op == "fused_attn_proj_residual" else 64
            group = 64 if op == "fused_attn_proj_residual" else group
            w4 = {"group": group, "symmetric": symmetric, "scale_dtype": sd}
            fn = narrow_k(op, block_k, n_out=80, k_in=C, **heads)
            record(f"{op} K loop BLOCK_K={block_k} C={C} {w4} B={B}", fn, op, B=B, C=C, bias=True, seed=group, S=300,
                   w4=w4, F=40, N=48, **heads)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
