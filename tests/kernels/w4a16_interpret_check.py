"""Run the W4A16 kernels under Triton's CPU interpreter on hypothesis-drawn cases; print each case's error
ratio against the FP64 oracle (JSON, last line).

Run by test_w4a16_interpreter.py in a subprocess with TRITON_INTERPRET=1 (the variable must be set before
Triton is imported). A case outside the tolerance fails inside hypothesis, which shrinks it and prints the
smallest failing example on stderr. Not a test module itself.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

sys.path.insert(0, str(Path(__file__).parent))
import interpret_check  # noqa: E402,F401  (the interpreter shim for NumPy >= 2.4)
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from w4a16_cases import check_case  # noqa: E402

from edgekit.kernels.launch_rule import resolve_program  # noqa: E402
from edgekit.kernels.program_runner import device_properties  # noqa: E402
from edgekit.kernels.triton_backend import TritonOp  # noqa: E402
from edgekit.kernels.variants import KernelVariant, default_variants, op_program  # noqa: E402

OP = "linear_w4a16"
results: list[dict] = []


def record(name: str, fn, **case) -> None:
    ratio = check_case(fn, device="cpu", **case)
    results.append({"case": name, "ratio": ratio})
    assert ratio <= 1.0, f"{name}: error / allowed = {ratio:.3g}"


def main() -> None:
    planned = TritonOp(OP)  # default variants for the call's rows: the GEMV for one row, the GEMM for more

    @settings(max_examples=int(os.environ.get("W4A16_EXAMPLES", "40")), deadline=None, database=None)
    @given(M=st.sampled_from([1, 1, 2, 5, 37]), groups=st.integers(1, 5), group=st.sampled_from([32, 64, 128]),
           N=st.integers(1, 70), symmetric=st.booleans(), scale_dtype=st.sampled_from([torch.float16, torch.float32]),
           bias=st.booleans(), act=st.sampled_from(["fp16", "fp32"]), seed=st.integers(0, 2**16))
    def planned_cases(M, groups, group, N, symmetric, scale_dtype, bias, act, seed):
        case = dict(M=M, K=group * groups, N=N, group=group, symmetric=symmetric, scale_dtype=scale_dtype, bias=bias,
                    act=act, seed=seed)
        record(f"{'gemv' if M == 1 else 'gemm'} {case}", planned, **case)

    planned_cases()

    # split-K: on the interpreter's pretend 8-SM device, K = 1280 in blocks of 256 (5 blocks) is split across
    # programs whose FP32 partials a second launch of the same kernel sums; M = 3 is a GEMV-only program (one
    # row per program), as planned for a batch-1 LM head
    gemv = {"w4a16_gemv": KernelVariant(OP, "w4a16_gemv", {"BLOCK_M": 1, "BLOCK_N": 8, "BLOCK_K": 256, "DECODE": 0}, 2, 1)}
    for M, symmetric, sd in ((1, False, torch.float16), (3, True, torch.float32)):
        case = dict(M=M, K=1280, N=32, group=128, symmetric=symmetric, scale_dtype=sd, bias=True, act="fp16", seed=M)
        x = torch.zeros(M, 1280, dtype=torch.float16)
        tensors = {"x": x, "weight": torch.zeros(32, 640, dtype=torch.uint8), "scale_h": torch.zeros(32, 10),
                   "offset_h": None, "scale_f": None, "offset_f": None, "bias": None}
        _, launches = resolve_program(op_program(OP, gemv), tensors, {"scale_row_stride": 10, "group_shift": 2},
                                      device_properties(x.device), lambda n, s, d: torch.empty(s))
        assert [ln.grid[2] > 1 for ln in launches] == [True, False], [ln.grid for ln in launches]
        record(f"gemv split-K M={M}", TritonOp(OP, gemv), **case)
    # every weight decode of the GEMV (1: words, x one by one; 2: words, x in runs; 0: bytes; 3: half2, the
    # pure-Triton twin of its PTX here; 4: 3 with the next step's words loaded ahead), K ending mid-tile
    for decode in (0, 1, 2, 3, 4):
        v = {"w4a16_gemv": KernelVariant(OP, "w4a16_gemv", {"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 256, "DECODE": decode},
                                         4, 1)}
        for symmetric in (False, True):
            case = dict(M=1, K=352, N=37, group=32, symmetric=symmetric, scale_dtype=torch.float32, bias=False,
                        act="fp16", seed=decode)
            record(f"gemv DECODE={decode} symmetric={symmetric}", TritonOp(OP, v), **case)
    # DECODE 3 with FP16 scales and offsets, several rows a thread and sub-blocks across steps; with FP32
    # activations it takes the FP32 words path (a variant compiled for FP32 activations)
    for act in ("fp16", "fp32"):
        for decode in (3, 4):
            v = {"w4a16_gemv": KernelVariant(OP, "w4a16_gemv",
                                             {"BLOCK_M": 1, "BLOCK_N": 64, "BLOCK_K": 128, "DECODE": decode}, 2, 1,
                                             dtype=act)}
            for group in (32, 128):
                case = dict(M=1, K=640, N=70, group=group, symmetric=False, scale_dtype=torch.float16, bias=True,
                            act=act, seed=group)
                record(f"gemv DECODE={decode} {act} G={group}", TritonOp(OP, v), **case)
    # the GEMM on a K tile of 4 sub-blocks that straddles groups of 32 and ends past K
    gemm = {"w4a16_gemm": default_variants(OP, rows=64)["w4a16_gemm"]}
    for group in (32, 64):
        case = dict(M=20, K=group * 5, N=40, group=group, symmetric=False, scale_dtype=torch.float16, bias=False,
                    act="fp16", seed=group)
        record(f"gemm K tile across groups G={group}", TritonOp(OP, {**gemm, **gemv}), **case)
    # the golden vectors a bundle carries (FP64 expected outputs at the default model's width, K = 576, G = 64),
    # for the decode row and a prefill bucket, through the kernels as a plugin runs them (spec-order call)
    from edgekit.builder.golden import golden_cases
    from edgekit.bundle.golden import check_case as check_golden
    from edgekit.model.presets import preset_config
    from edgekit.runtime.gpu_runner import call_with_spec_order

    for c in golden_cases(OP, preset_config("smollm2-135m"), buckets=(16,), context=64):
        v = check_golden(OP, c, lambda op, inputs, attrs, plugin: call_with_spec_order(planned, op, inputs, attrs))
        results.append({"case": f"golden {c.meta.name}", "ratio": v.max_ratio if v.ok else float("inf")})
        assert v.ok, v
    print(json.dumps(results))


if __name__ == "__main__":
    main()
