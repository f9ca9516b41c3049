"""Run the Qwen3 / Gemma 3 operators' Triton kernels (qk_norm_rope, geglu, attention_prefill with a sliding window)
under Triton's CPU interpreter on hypothesis-drawn cases; print each case's error ratio against the FP64 oracle
(JSON, last line).

Run by test_family_ops_interpreter.py in a subprocess with TRITON_INTERPRET=1 (the variable must be set before
Triton is imported). A case outside the tolerance fails inside hypothesis, which shrinks it and prints the smallest
failing example on stderr. Not a test module itself.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

sys.path.insert(0, str(Path(__file__).parent))
import interpret_check  # noqa: E402,F401  (the interpreter shims for NumPy >= 2.4 and the per-launch patching)
import fp64_oracle as oracle  # noqa: E402
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from edgekit.builder.golden import golden_cases  # noqa: E402
from edgekit.bundle.golden import check_case  # noqa: E402
from edgekit.kernels import attention, geglu, qk_norm_rope  # noqa: E402
from edgekit.kernels.registry import OPERATORS  # noqa: E402
from edgekit.kernels.rope import rope_frequencies  # noqa: E402
from edgekit.kernels.triton_backend import TritonOp, triton_ops  # noqa: E402
from edgekit.kernels.variants import KernelVariant  # noqa: E402
from edgekit.model.presets import preset_config  # noqa: E402

EXAMPLES = int(os.environ.get("FAMILY_OPS_EXAMPLES", "25"))
ACT = {"fp16": torch.float16, "fp32": torch.float32}
results: list[dict] = []


def record(name: str, spec, got, want, act: str) -> None:
    tol = spec.tolerance_for("float16" if act == "fp16" else "float32")
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
    ratio = max(oracle.within(g, w, tol.atol, tol.rtol)[1] for g, w in zip(got, want))
    results.append({"case": name, "ratio": ratio})
    assert ratio <= 1.0, f"{name}: error / allowed = {ratio:.3g}"


def main() -> None:
    ops = triton_ops()

    @settings(max_examples=EXAMPLES, deadline=None, database=None)
    @given(B=st.integers(1, 2), T=st.integers(1, 9), hkv=st.integers(1, 2), group=st.sampled_from([1, 2, 4]),
           D=st.sampled_from([16, 64, 128, 256]), act=st.sampled_from(list(ACT)), seed=st.integers(0, 2**16))
    def qk_norm_rope_cases(B, T, hkv, group, D, act, seed):
        g = torch.Generator().manual_seed(seed)
        dt, hq = ACT[act], hkv * group
        qkv = (torch.randn(B, T, (hq + 2 * hkv) * D, generator=g) * 3).to(dt)
        qn, kn = ((1 + 0.3 * torch.randn(D, generator=g)).to(dt) for _ in range(2))
        cos, sin = rope_frequencies(D, T + 5, 1e6)
        pos = torch.randint(0, T + 5, (B, T), generator=g)
        cos, sin = cos[pos], sin[pos]  # (B, T, D/2): any positions, as a decode step gathers them
        record(f"qk_norm_rope {dict(B=B, T=T, hq=hq, hkv=hkv, D=D, act=act)}", qk_norm_rope.SPEC,
               ops["qk_norm_rope"](qkv, qn, kn, cos, sin, hq, hkv, 1e-6),
               oracle.qk_norm_rope(qkv, qn, kn, cos, sin, hq, hkv, 1e-6), act)

    @settings(max_examples=EXAMPLES, deadline=None, database=None)
    @given(rows=st.integers(1, 5), F=st.integers(1, 300), act=st.sampled_from(list(ACT)), seed=st.integers(0, 2**16))
    def geglu_cases(rows, F, act, seed):
        gu = (torch.randn(rows, 2 * F, generator=torch.Generator().manual_seed(seed)) * 3).to(ACT[act])
        record(f"geglu {dict(rows=rows, F=F, act=act)}", geglu.SPEC, ops["geglu"](gu), oracle.geglu(gu), act)

    # BLOCK_M / BLOCK_N of 16 and 32 so a short sequence still crosses several key blocks: a window then skips some,
    # masks the ones its edge cuts and runs the rest unmasked
    tiles = st.sampled_from([(16, 16), (32, 16), (16, 32), (32, 32)])

    @settings(max_examples=EXAMPLES, deadline=None, database=None)
    @given(T=st.integers(1, 80), hkv=st.integers(1, 2), group=st.sampled_from([1, 4]), D=st.sampled_from([16, 64]),
           tile=tiles, act=st.sampled_from(list(ACT)), data=st.data())
    def window_cases(T, hkv, group, D, tile, act, data):
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
        dt, hq = ACT[act], hkv * group
        q = torch.randn(2, hq, T, D, generator=g).to(dt)
        k, v = torch.randn(2, hkv, T, D, generator=g).to(dt), torch.randn(2, hkv, T, D, generator=g).to(dt)
        sl = torch.tensor([T, data.draw(st.integers(1, T))])
        window = data.draw(st.sampled_from([0, 1, 2, 7, 16, 17, 33, max(1, T // 2), T]))
        bm, bn = tile
        variant = KernelVariant("attention_prefill", "attention_prefill_fwd",
                                {"HEAD_DIM": D, "BLOCK_M": bm, "BLOCK_N": bn}, 4, 1, act)
        op = TritonOp("attention_prefill", {"attention_prefill_fwd": variant})
        record(f"attention_prefill window={window} {dict(T=T, hq=hq, hkv=hkv, D=D, tile=tile, act=act)}",
               attention.PREFILL_SPEC, op(q, k, v, sl, None, window),
               oracle.attention_prefill(q, k, v, sl, None, window), act)

    qk_norm_rope_cases()
    geglu_cases()
    window_cases()
    # and every kind of window on one fixed case, whatever hypothesis drew: none, one key, a window that cuts key
    # blocks of 16, one that is a whole block, and one longer than the sequence
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, h, 50, 16, generator=g).half() for h in (4, 2, 2))
    sl = torch.tensor([50, 23])
    tile = {"HEAD_DIM": 16, "BLOCK_M": 16, "BLOCK_N": 16}
    variant = KernelVariant("attention_prefill", "attention_prefill_fwd", tile, 4, 1, "fp16")
    op = TritonOp("attention_prefill", {"attention_prefill_fwd": variant})
    for window in (0, 1, 7, 16, 64):
        record(f"attention_prefill fixed window={window}", attention.PREFILL_SPEC, op(q, k, v, sl, None, window),
               oracle.attention_prefill(q, k, v, sl, None, window), "fp16")

    # the golden vectors a gemma-3-1b bundle ships for these operators (FP64 expected outputs), through the same kernels
    def run(op_name, inputs, attrs, plugin):
        spec = OPERATORS[op_name].spec
        return ops[op_name](*(inputs.get(t.name) for t in spec.inputs), *(attrs.get(a) for a in spec.attributes))

    cfg = preset_config("gemma-3-1b")
    for op_name in ("qk_norm_rope", "geglu", "attention_prefill"):
        for case in golden_cases(op_name, cfg, (16,), 64):
            verdict = check_case(op_name, case, run)
            results.append({"case": f"golden {case.meta.name}", "ratio": verdict.max_ratio})
            assert verdict.ok, verdict
    print(json.dumps(results))


if __name__ == "__main__":
    main()
