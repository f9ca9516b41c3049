"""Every fused decode kernel cross-compiles (no GPU) for the Orin (sm_87) and the H200 (sm_90) within 128 KB of
shared memory and without register spills, at the head dims the presets use (and the Qwen3 / Gemma 3 shapes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edgekit.kernels.aot import compile_variant
from edgekit.kernels.variants import default_variants

sys.path.insert(0, str(Path(__file__).parent))
from fused_cases import FAMILY_FUSED_OPS, FUSED_OPS  # noqa: E402

ORIN_SMEM_BUDGET = 128 * 1024


@pytest.mark.parametrize("arch", [87, 90])
@pytest.mark.parametrize("op", FUSED_OPS)
def test_fused_kernels_compile_for_orin_and_hopper(op, arch):
    for head_dim in ((64, 128) if op == "fused_norm_qkv_rope" else (64,)):
        for dtype in ("fp16", "bf16"):
            for kernel, v in default_variants(op, head_dim=head_dim, dtype=dtype).items():
                ck = compile_variant(v, arch, budget_bytes=ORIN_SMEM_BUDGET)
                assert ck.shared_bytes <= ORIN_SMEM_BUDGET, (kernel, ck.shared_bytes)
                if ck.registers is not None:  # the bundled ptxas reports them (absent only without ptxas)
                    assert ck.registers <= 255, (kernel, ck.registers)
                    assert ck.spills in (None, {"stores": 0, "loads": 0}), (kernel, ck.spills)


@pytest.mark.parametrize("arch", [87, 90])
@pytest.mark.parametrize("op", ["fused_norm_qkv_rope", "fused_norm_swiglu", "fused_proj_residual"])
def test_int4_kernels_at_1b_shapes_compile_without_spills(op, arch):
    # the INT4 tiles (fused_gemv_triton.int4_gemv_tile) follow the model's shapes: at llama-3.2-1b they hold 128-256
    # weights a thread, which must stay in registers for the half2 decode (FP16) and the FP32 word decode (BF16)
    from edgekit.model.presets import preset_config
    from edgekit.plan.tiles import step_weight_shape

    cfg = preset_config("llama-3.2-1b")
    facts = {**step_weight_shape(op, cfg), "head_dim": cfg.head_dim, "n_heads": cfg.n_heads,
             "n_kv_heads": cfg.n_kv_heads}
    for dtype in ("fp16", "bf16"):
        v = next(v for k, v in default_variants(op, dtype=dtype, **facts).items() if k.endswith("_w4"))
        ck = compile_variant(v, arch, budget_bytes=ORIN_SMEM_BUDGET)
        assert ck.shared_bytes <= ORIN_SMEM_BUDGET, (v.label(), ck.shared_bytes)
        if ck.registers is not None:
            assert ck.spills in (None, {"stores": 0, "loads": 0}), (v.label(), ck.registers, ck.spills)


@pytest.mark.parametrize("arch", [87, 90])
def test_staged_default_tiles_compile_to_asynchronous_copies(arch):
    # KernelDef.loop_stages: the variant's num_stages reaches the K loop (tl.range(num_stages=STAGES)), whose weight
    # tiles Triton then stages through shared memory by cp.async; without it the loop streams through registers
    import dataclasses

    from edgekit.model.presets import preset_config
    from edgekit.plan.tiles import step_weight_shape

    cfg = preset_config("llama-3.2-1b")
    staged = []
    for op in ("fused_norm_swiglu", "fused_proj_residual"):
        facts = {**step_weight_shape(op, cfg), "head_dim": cfg.head_dim, "n_heads": cfg.n_heads,
                 "n_kv_heads": cfg.n_kv_heads}
        staged += [v for v in default_variants(op, **facts).values() if v.num_stages > 1]
    assert {v.kernel for v in staged} >= {"norm_swiglu_w4", "proj_residual_fp", "proj_residual_w8"}
    for v in staged:
        ck = compile_variant(v, arch, budget_bytes=ORIN_SMEM_BUDGET)
        assert "cp.async" in ck.ptx and ck.shared_bytes <= ORIN_SMEM_BUDGET, (v.label(), ck.shared_bytes)
        plain = compile_variant(dataclasses.replace(v, num_stages=1), arch)
        assert "cp.async" not in plain.ptx and plain.shared_bytes < ck.shared_bytes, v.label()


# Qwen3 / Gemma 3 shapes: hidden, intermediate, query heads, KV heads, head_dim (the models' configs)
FAMILY_SHAPES = {"qwen3-0.6b": (1024, 3072, 16, 8, 128), "qwen3-4b": (2560, 9728, 32, 8, 128),
                 "gemma-3-1b": (1152, 6912, 4, 1, 256)}


def family_facts(op: str, model: str) -> dict:
    """The shape facts a plan tiles ``op``'s kernels at for ``model`` (the weight its decode calls multiply)."""
    C, F, hq, hkv, d = FAMILY_SHAPES[model]
    weight = {"fused_norm_qkv_qknorm_rope": ((hq + 2 * hkv) * d, C), "fused_attn_proj": (C, hq * d),
              "fused_norm_geglu": (2 * F, C)}.get(op)
    return {"head_dim": d, "n_heads": hq, "n_kv_heads": hkv, "hidden_size": C,
            **({"n_out": weight[0], "k_in": weight[1]} if weight else {})}


@pytest.mark.parametrize("arch", [87, 90])
@pytest.mark.parametrize("op", FAMILY_FUSED_OPS)
def test_family_fused_kernels_compile_within_128_kb_without_spills_at_the_models_shapes(op, arch):
    """Every default variant of the Qwen3 / Gemma 3 fused operators (float, INT8 and INT4 kernels, FP16 and BF16) at
    each model's shapes, and at the shape-less default a plan without facts gets."""
    facts = [family_facts(op, m) for m in FAMILY_SHAPES] + [{"head_dim": 64}]
    for f in facts:
        for dtype in ("fp16", "bf16"):
            for kernel, v in default_variants(op, dtype=dtype, **f).items():
                ck = compile_variant(v, arch, budget_bytes=ORIN_SMEM_BUDGET)
                assert ck.shared_bytes <= ORIN_SMEM_BUDGET, (v.label(), ck.shared_bytes)
                if ck.registers is not None:
                    assert ck.registers <= 255, (v.label(), ck.registers)
                    assert ck.spills in (None, {"stores": 0, "loads": 0}), (v.label(), ck.registers, ck.spills)
