"""The persistent decode kernel cross-compiles (no GPU) for the Orin (sm_87) within 128 KB of shared memory and
the 255-register limit, at the llama-3.2-1b shape with INT8 weights (its largest tiles); ptxas reports its
registers and spills (tools/fused_kernels_report.py prints them for every preset)."""

from __future__ import annotations

from edgekit.kernels.persistent_decode_triton import cross_compile
from edgekit.model.presets import preset_config

ORIN_SMEM_BUDGET = 128 * 1024


def test_persistent_kernel_compiles_for_orin_within_budget():
    r = cross_compile(preset_config("llama-3.2-1b"), 87, {"qkv": True, "o": True, "gate_up": True, "down": True})
    assert r["arch"] == "sm_87" and r["constexprs"]["STAGE"] == 0 and r["constexprs"]["GU_INT8"] == 1
    assert 0 < r["shared_bytes"] <= ORIN_SMEM_BUDGET, r
    if r["registers"] is not None:  # the bundled ptxas reports them
        assert r["registers"] <= 255 and r["spills"] is not None, r
