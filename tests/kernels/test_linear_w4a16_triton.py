"""The W4A16 kernels' host side (kernels/linear_w4a16_triton.py): clear refusals of bad calls, the scale slots
each dtype takes, and the GEMV tile the planner picks from the space (no GPU needed: meta tensors, sm_87 compile)."""

from __future__ import annotations

import pytest
import torch

from edgekit.errors import OperatorError
from edgekit.kernels.aot import compile_variant
from edgekit.kernels.linear_w4a16_triton import GEMV_DEFAULT, prepare_w4a16
from edgekit.kernels.variants import default_variants, estimate_shared_bytes, tile_space
from edgekit.plan.tiles import solve_kernel

META = "meta"


def _call(K=256, N=64, groups=2, scale_dtype=torch.float16, with_offset=True, **change):
    t = {"x": torch.empty(3, K, dtype=torch.float16, device=META),
         "qweight": torch.empty(N, K // 2, dtype=torch.uint8, device=META),
         "scale": torch.empty(N, groups, dtype=scale_dtype, device=META)}
    t["offset"] = torch.empty(N, groups, dtype=scale_dtype, device=META) if with_offset else None
    t.update(change)
    return t


@pytest.mark.parametrize("scale_dtype,slot", [(torch.float16, "_h"), (torch.float32, "_f")])
def test_scales_go_to_the_slot_of_their_dtype_and_the_group_is_a_shift(scale_dtype, slot):
    c = _call(K=512, groups=8, scale_dtype=scale_dtype)  # G = 64
    tensors, attrs, _ = prepare_w4a16(c["x"], c["qweight"], c["scale"], c["offset"])
    other = "_f" if slot == "_h" else "_h"
    assert tensors["scale" + slot] is c["scale"] and tensors["offset" + slot] is c["offset"]
    assert tensors["scale" + other] is None and tensors["offset" + other] is None
    assert attrs == {"scale_row_stride": 8, "group_shift": 1}  # 64 = 32 << 1


@pytest.mark.parametrize("change,message", [
    ({"qweight": torch.empty(64, 128, dtype=torch.int8, device=META)}, "qweight has dtype torch.int8; expected torch.uint8"),
    ({"qweight": torch.empty(64, 100, dtype=torch.uint8, device=META)}, "holds K = 200"),
    ({"scale": torch.empty(64, 3, dtype=torch.float16, device=META)}, r"expected \(N, K/G\) with G in \(32, 64, 128\)"),
    ({"scale": torch.empty(64, 1, dtype=torch.float16, device=META)}, "G in"),  # G = 256
    ({"scale": torch.empty(64, 2, dtype=torch.bfloat16, device=META)}, "expected float16 or float32"),
    ({"offset": torch.empty(64, 2, dtype=torch.float32, device=META)}, "offset has dtype torch.float32 but scale"),
    ({"offset": torch.empty(64, 4, dtype=torch.float16, device=META)}, "expected the scale's"),
])
def test_bad_calls_are_refused_with_what_was_received(change, message):
    c = _call(**change)
    with pytest.raises(OperatorError, match=message):
        prepare_w4a16(c["x"], c["qweight"], c["scale"], c["offset"])


def test_the_planner_takes_the_measured_gemv_default():
    # the planner ranks by tile size, not speed: the space is built so that its pick is the measured default
    space = [v for v in tile_space("linear_w4a16", rows=1) if v.kernel == "w4a16_gemv"]
    default = default_variants("linear_w4a16", rows=1)["w4a16_gemv"]
    assert default in space and {v.constexprs["DECODE"] for v in space} == {GEMV_DEFAULT[0]["DECODE"]}
    choice = solve_kernel(space, budget_bytes=131072, per_sm_bytes=167936, arch="sm_87",
                          estimate=estimate_shared_bytes, compile_fn=lambda v: compile_variant(v, 87),
                          default_warps=default.num_warps)
    assert choice.variant == default and choice.shared_bytes <= 131072 and not choice.spill_bytes


@pytest.mark.parametrize("arch", [87, 90])
def test_the_half2_gemv_reads_each_scale_dtype_at_its_width(arch):
    # the interpreter runs the twin (tl.load); the compiled kernel loads scales in inline PTX, which must read
    # 2 bytes for FP16 scales / offsets and 4 for FP32 ones (a 4-byte read of FP16 scales gives wrong weights)
    import re

    from edgekit.kernels.variants import KernelVariant

    v = KernelVariant("linear_w4a16", "w4a16_gemv", {"BLOCK_M": 1, "BLOCK_N": 64, "BLOCK_K": 256, "DECODE": 3}, 2, 1)
    ptx = compile_variant(v, arch).ptx
    # one scale and one offset load a (row, sub-block) element a thread holds, for each storage dtype
    per_thread = 64 * (256 // 32) // 64
    assert len(re.findall(r"ld\.global\.nc\.b16", ptx)) == 2 * per_thread
    assert len(re.findall(r"ld\.global\.nc\.b32", ptx)) == 2 * per_thread
    assert "mul.rn.f16x2" in ptx and "lop3.b32" in ptx  # the half2 path, not the FP32 twin
