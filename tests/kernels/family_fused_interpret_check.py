"""Run the Qwen3 / Gemma 3 fused decode operators' Triton kernels under Triton's CPU interpreter; print error ratios
(JSON) against the FP64 oracle (fused_cases.py).

Fixed cases: float and INT8 weights at two shapes (a K loop ending in a partial block, one and two sequences, bias
or none), QK-norm at one, two and four query heads per KV head (the group each counter gathers) and at head_dim 64
and 128 with several programs a head, the split-KV attention over 5-8 splits, the bundles' golden cases (FP16 at
1 and 4 sequences, INT8, INT4). Hypothesis draws INT4 (W4A16) cases (group 32/64/128, symmetric or offsets, FP16 or
FP32 scales, bias), INT4 K loops of several steps and FP16 activations up to 8000 (the half2 decode's range). A case
outside the tolerance fails inside hypothesis, which shrinks it and prints the smallest failing example on stderr.

Run by test_family_fused_interpreter.py in a subprocess with TRITON_INTERPRET=1. Not a test module itself.
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
from fused_cases import FAMILY_FUSED_OPS, FAMILY_INT4_OPS, check_case  # noqa: E402
from fused_int4_interpret_check import narrow_k  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from edgekit.kernels.triton_backend import TritonOp, triton_ops  # noqa: E402
from edgekit.kernels.variants import default_variants  # noqa: E402

results: list[dict] = []
HEADS = dict(n_heads=4, n_kv_heads=2, head_dim=32)  # attention's K = n_heads * head_dim = 128


def record(name: str, fn, op: str, **case) -> None:
    ratios = check_case(op, fn, device="cpu", **case)
    results.append({"case": name, "ratios": ratios})
    assert all(v <= 1.0 for v in ratios.values()), f"{name}: error / allowed = {ratios}"


def main() -> None:
    ops = triton_ops()
    for op in FAMILY_FUSED_OPS:
        for int8 in ((False, True) if op in FAMILY_INT4_OPS else (False,)):
            for B, C, bias in ((1, 64, True), (2, 48, False)):  # C=48: a K loop with a partial block
                # S=300: the split-KV attention splits the cache (3 splits at the interpreter's 8 SMs)
                record(f"{op} {'w8a16' if int8 else 'fp16'} B={B} C={C} bias={bias}", ops[op], op, B=B, C=C,
                       int8=int8, bias=bias, seed=len(results), S=300, **HEADS)
    # the group a counter gathers: 1 (MHA), 2 and 4 query heads per KV head (gemma-3-1b: 4), and head_dims 64 and
    # 128 (8 and 16 programs a head at the default tiles of these widths)
    op = "fused_norm_qkv_qknorm_rope"
    for hq, hkv, d, B in ((2, 2, 32, 2), (4, 1, 64, 1), (8, 2, 128, 2)):
        record(f"{op} Hq={hq} Hkv={hkv} D={d} B={B}", ops[op], op, B=B, C=64, int8=False, bias=False,
               seed=len(results), S=40, n_heads=hq, n_kv_heads=hkv, head_dim=d)
    # 900-1200 keys in 8 splits of 128-256: 5-8 splits hold keys, more than one SPLIT_STEP (4) of the merge's loop
    record("fused_attn_proj fp16 B=2 S=1200", ops["fused_attn_proj"], "fused_attn_proj", B=2, C=64, int8=False,
           bias=False, seed=len(results), S=1200, min_seq_len=900, **HEADS)

    # the key block a GPU with room for it takes (attention_triton._decode_default; an sm_90 opts in to 227 KB a
    # block): 128 keys at head_dim 128; 1500-1800 keys in 4 splits (the interpreter's 8 SMs, 8 sequence x KV heads)
    # of 3-4 blocks each: the online softmax carried across blocks and the pipeline's steady state
    wide = default_variants("fused_attn_proj", head_dim=128, n_heads=8, n_kv_heads=4, n_out=64, k_in=1024,
                            shared_bytes_per_block=232448)
    assert wide["attn_split_combine"].constexprs["BLOCK_N"] == 128, wide
    record("fused_attn_proj fp16 B=2 S=1800 D=128 BLOCK_N=128", TritonOp("fused_attn_proj", wide), "fused_attn_proj",
           B=2, C=64, int8=False, bias=False, seed=len(results), S=1800, min_seq_len=1500, n_heads=8, n_kv_heads=4,
           head_dim=128)

    @settings(max_examples=int(os.environ.get("FAMILY_INT4_EXAMPLES", "6")), deadline=None, database=None)
    @given(op=st.sampled_from(FAMILY_INT4_OPS), group=st.sampled_from([32, 64, 128]), groups=st.integers(1, 3),
           symmetric=st.booleans(), scale_dtype=st.sampled_from([torch.float16, torch.float32]), B=st.integers(1, 2),
           bias=st.booleans(), seed=st.integers(0, 2**16))
    def drawn(op, group, groups, symmetric, scale_dtype, B, bias, seed):
        w4 = {"group": group, "symmetric": symmetric, "scale_dtype": scale_dtype}
        C = group * groups  # the reduction of every op but attention's (n_heads * head_dim = 128: group 32-128)
        record(f"{op} {w4} B={B} C={C} bias={bias}", ops[op], op, B=B, C=C, int8=False, bias=bias, seed=seed, S=300,
               w4=w4, F=40, N=48, **HEADS)

    drawn()

    @settings(max_examples=int(os.environ.get("FAMILY_INT4_RANGE_EXAMPLES", "3")), deadline=None, database=None)
    @given(op=st.sampled_from(FAMILY_INT4_OPS), group=st.sampled_from([32, 64]), symmetric=st.booleans(),
           act_range=st.sampled_from([1024.0, 8000.0]), seed=st.integers(0, 2**16))
    def wide(op, group, symmetric, act_range, seed):
        w4 = {"group": group, "symmetric": symmetric, "scale_dtype": torch.float16}
        record(f"{op} range |x| <= {act_range} {w4} C={2 * group}", ops[op], op, B=1, C=2 * group, int8=False,
               bias=False, seed=seed, S=300, w4=w4, F=40, N=48, act_range=act_range, **HEADS)

    wide()

    # INT4 K loops of several steps (C = 160 in steps of 64, groups of 32; attention's K = 128 in steps of 32)
    for op in FAMILY_INT4_OPS:
        heads = dict(HEADS, n_heads=2, n_kv_heads=1) if op == "fused_norm_qkv_qknorm_rope" else HEADS
        block_k, group = (32, 64) if op == "fused_attn_proj" else (64, 32)
        w4 = {"group": group, "symmetric": False, "scale_dtype": torch.float16}
        fn = narrow_k(op, block_k, n_out=80, k_in=160, **heads)
        record(f"{op} K loop BLOCK_K={block_k} C=160 {w4} B=2", fn, op, B=2, C=160, int8=False, bias=True,
               seed=group, S=300, w4=w4, F=40, N=48, **heads)

    # the golden vectors a bundle carries for each operator (FP64 expected outputs; FP16, INT8 and INT4 weights: every
    # kernel a plugin ships), through the kernels as a plugin runs them (spec-order call)
    from edgekit.builder.golden import golden_cases
    from edgekit.bundle.golden import check_case as check_golden
    from edgekit.model.presets import preset_config
    from edgekit.runtime.gpu_runner import call_with_spec_order

    for op in FAMILY_FUSED_OPS:
        for c in golden_cases(op, preset_config("tiny"), buckets=(16,), context=64):
            v = check_golden(op, c, lambda op, inputs, attrs, plugin: call_with_spec_order(ops[op], op, inputs, attrs))
            ratio = v.max_ratio if v.ok else float("inf")
            results.append({"case": f"golden {c.meta.name}", "ratios": {"golden": ratio}})
    print(json.dumps(results))


if __name__ == "__main__":
    main()
