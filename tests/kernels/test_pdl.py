"""Programmatic dependent launch (kernels/pdl_triton.py): which launches use it, and what the compiled kernels do.

The speed it buys is measured on the H200 by scripts/bench_decode_vs_llamacpp.py (EDGEKIT_PDL=0 against the
default, same call); here: plugins (sm_87, and the AOT build for any arch) carry no PDL instruction, and a kernel
compiled for sm_90 with PDL issues only weight prefetches before it waits for the previous kernel.
"""

from __future__ import annotations

import re

import pytest
import torch

from edgekit.errors import OperatorError
from edgekit.kernels import pdl_triton
from edgekit.kernels.aot import _source, compile_variant
from edgekit.kernels.variants import default_variants, op_kernels

PDL_OPS = ("fused_norm_qkv_rope", "fused_attn_proj_residual", "fused_norm_swiglu", "fused_proj_residual",
           "fused_head_argmax", "fused_norm_qkv_qknorm_rope", "fused_attn_proj", "fused_norm_geglu", "norm_residual",
           "attention_decode")
# operators outside the fused step whose kernels are not all PDL-switched: the per-operator decode attention's split
# kernel has the switch (and the fused attention's prefetch), its reduce kernel none (it launches plainly)
PARTLY_PDL = {"attention_decode": ("attention_decode_reduce",)}


def _pdl_kernels(op):
    """The op's default variants at a small model's shapes, and those that stage their K loop at 1B-class ones."""
    kdefs = {k.kernel: k for k in op_kernels()[op].kernels}
    for kernel, v in default_variants(op, head_dim=64, k_in=576, n_out=1536).items():
        if kernel in PARTLY_PDL.get(op, ()):
            assert not kdefs[kernel].pdl, f"{op}/{kernel} has a PDL switch now: take it out of PARTLY_PDL"
            continue
        assert kdefs[kernel].pdl, f"{op}/{kernel} has no PDL switch: it would break the decode step's launch chain"
        yield kdefs[kernel], v
    staged = {v for k_in, n_out in ((2048, 16384), (8192, 2048))
              for kernel, v in default_variants(op, head_dim=64, k_in=k_in, n_out=n_out).items()
              if v.num_stages > 1 and kdefs[kernel].loop_stages and kernel not in PARTLY_PDL.get(op, ())}
    for v in sorted(staged, key=lambda v: v.label()):
        yield kdefs[v.kernel], v


def test_no_pdl_below_hopper_whatever_is_asked():
    assert pdl_triton.level_for(87, 2, 2) == 0 and pdl_triton.level_for(87, None, 2) == 0
    assert pdl_triton.pdl_level(torch.device("cpu")) == 0  # Triton's CPU interpreter never sees griddepcontrol


def test_the_environment_forces_a_level_else_the_decode_step_decides():
    assert pdl_triton.level_for(90, None, 2) == 2  # inside a step that asks for it
    assert pdl_triton.level_for(90, None, 0) == 0  # outside a step (or one that does not ask)
    assert pdl_triton.level_for(90, 0, 2) == 0 and pdl_triton.level_for(90, 1, 0) == 1  # EDGEKIT_PDL wins


def test_the_level_comes_from_the_environment_and_a_bad_one_is_refused(monkeypatch):
    monkeypatch.delenv(pdl_triton.ENV, raising=False)
    assert pdl_triton.requested_level() is None
    monkeypatch.setenv(pdl_triton.ENV, "1")
    assert pdl_triton.requested_level() == 1
    monkeypatch.setenv(pdl_triton.ENV, "attn")
    assert pdl_triton.requested_level() == pdl_triton.AFTER_ATTENTION_OPS
    monkeypatch.setenv(pdl_triton.ENV, "attn+fused_norm_swiglu")
    assert pdl_triton.requested_level() == {**pdl_triton.AFTER_ATTENTION_OPS, "fused_norm_swiglu": 2}
    for raw in ("attn+fused_norm_qkv_rope", "fused_norm_qkv_rope+attn"):  # a named operator waits, in either order
        monkeypatch.setenv(pdl_triton.ENV, raw)
        assert pdl_triton.requested_level() == {**pdl_triton.AFTER_ATTENTION_OPS, "fused_norm_qkv_rope": 2}
    for bad, unknown in (("on", "on"), ("attn+fused_norm_swigl", "fused_norm_swigl")):
        monkeypatch.setenv(pdl_triton.ENV, bad)
        with pytest.raises(OperatorError, match=re.escape(f"EDGEKIT_PDL='{bad}'; expected one of 0, 1, 2, attn") + f".*unknown: {unknown} "):
            pdl_triton.requested_level()


def test_an_ask_per_operator_sets_pdl_only_for_the_attention_operators_launches():
    """``attn``: the split-KV attention lets the projection after it launch early (which prefetches its weights), the
    QKV operators before it let it launch early (TRIGGER: launched plainly themselves); every other kernel of the
    step launches plainly, and so does a launch outside any operator."""
    ask = pdl_triton.AFTER_ATTENTION_OPS
    want = {"fused_attn_proj_residual": 2, "fused_attn_proj": 2,
            "fused_norm_qkv_rope": pdl_triton.TRIGGER, "fused_norm_qkv_qknorm_rope": pdl_triton.TRIGGER}
    assert {op: pdl_triton.level_for(90, None, ask, op) for op in PDL_OPS} == {op: want.get(op, 0) for op in PDL_OPS}
    assert pdl_triton.level_for(90, None, ask, None) == 0
    assert pdl_triton.level_for(87, None, ask, "fused_attn_proj") == 0  # no griddepcontrol below Hopper
    assert pdl_triton.level_for(90, ask, 2, "fused_norm_swiglu") == 0  # EDGEKIT_PDL=attn wins over the step's 2
    assert pdl_triton.level_for(90, 1, ask, "fused_norm_swiglu") == 1  # and a forced level over the step's ask


def _meta_weights(preset: str, int8: bool):
    """A preset's weights on the meta device (shapes and dtypes only), FP16 or W8A16 projections."""
    from edgekit.graph.builder import LinearSchemes
    from edgekit.model.presets import preset_config
    from edgekit.model.weights import empty_weights

    cfg = preset_config(preset)
    return empty_weights(cfg, LinearSchemes.uniform(cfg.n_layers, "w8a16" if int8 else "fp16"))


@pytest.mark.parametrize("int8", [False, True])
def test_the_fused_step_asks_for_pdl_where_it_was_measured_faster(int8):
    """H200, 2026-12-01: PDL everywhere made smollm2-135m's fused step faster and llama-3.2-1b's slower; 2026-12-04:
    PDL for the attention operators only made the 1B-class steps faster (pdl_launch.py)."""
    from edgekit.runtime.fused_step import weight_bytes_per_kernel

    small, large = (weight_bytes_per_kernel(_meta_weights(p, int8)) for p in ("smollm2-135m", "llama-3.2-1b"))
    assert small < pdl_triton.AUTO_MAX_WEIGHT_BYTES_PER_KERNEL < large
    assert pdl_triton.auto_level(small) == pdl_triton.DEFAULT_LEVEL
    assert pdl_triton.auto_level(large) == pdl_triton.AFTER_ATTENTION_OPS


def test_a_step_level_holds_only_inside_the_step():
    seen = []
    with pdl_triton.step_launches(2):
        seen.append(pdl_triton._STEP_LEVEL.get())
    seen.append(pdl_triton._STEP_LEVEL.get())
    assert seen == [2, 0]


@pytest.mark.parametrize("arch", [87, 90])
@pytest.mark.parametrize("op", PDL_OPS)
def test_plugins_are_built_without_pdl(op, arch):
    for kdef, v in _pdl_kernels(op):
        ptx = compile_variant(v, arch, with_ptxas_stats=False).ptx
        assert "griddepcontrol" not in ptx and "prefetch.global.L2" not in ptx, kdef.kernel


def _body(ptx: str) -> str:
    return ptx[ptx.index(".entry"):]


@pytest.mark.parametrize("op", PDL_OPS)
def test_on_hopper_only_weight_prefetches_come_before_the_wait(op):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for kdef, v in _pdl_kernels(op):
        for level in (1, 2):
            ck = triton.compile(_source(kdef, v, ASTSource, pdl=level), target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": v.num_warps, "num_stages": v.num_stages})
            body = _body(ck.asm["ptx"])
            assert body.count("griddepcontrol.wait") == 1 and body.count("griddepcontrol.launch_dependents") == 1
            wait = body.index("griddepcontrol.wait")
            assert body.index("griddepcontrol.launch_dependents") > wait
            writes = [m.start() for m in re.finditer(r"\b(st|atom|red)\.global|\bcp\.async", body)]
            reads = [m.start() for m in re.finditer(r"\bld\.global", body)]
            assert writes and min(writes) > wait, f"{kdef.kernel}: a write before the wait (level {level})"
            # the split-KV attention reads the sequence lengths (made at the step's start) to prefetch its first
            # key / value tile at level 2; nothing else reads before the wait
            reads_kv = level == 2 and any(p.name == "seq_lens_ptr" for p in kdef.params)
            early = [r for r in reads if r < wait]
            assert reads and len(early) == (1 if reads_kv else 0), f"{kdef.kernel}: reads before the wait {len(early)}"
            prefetch = [m.start() for m in re.finditer(r"prefetch\.global\.L2", body)]
            takes_weights = any(p.name == "w_ptr" for p in kdef.params)
            if level == 2 and (takes_weights or reads_kv):
                assert prefetch and max(prefetch) < wait, kdef.kernel
            else:
                assert not prefetch, kdef.kernel


@pytest.mark.parametrize("op", PDL_OPS)
def test_on_hopper_a_trigger_level_kernel_only_lets_the_next_one_launch(op):
    """Level TRIGGER (the QKV operators before the attention): launched plainly, so no wait and no prefetch; the one
    launch_dependents comes before the kernel's first global access, at its start."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for kdef, v in _pdl_kernels(op):
        ck = triton.compile(_source(kdef, v, ASTSource, pdl=pdl_triton.TRIGGER), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": v.num_warps, "num_stages": v.num_stages})
        body = _body(ck.asm["ptx"])
        assert "griddepcontrol.wait" not in body and "prefetch.global.L2" not in body, kdef.kernel
        assert body.count("griddepcontrol.launch_dependents") == 1, kdef.kernel
        memory = [m.start() for m in re.finditer(r"\b(ld|st|atom|red)\.global|\bcp\.async", body)]
        assert memory and min(memory) > body.index("griddepcontrol.launch_dependents"), kdef.kernel


def test_a_launch_gets_the_level_its_operator_is_asked_for(monkeypatch):
    """The JIT launcher's options follow the operator of the kernel launched (program_runner passes its op)."""
    from edgekit.kernels import pdl_launch

    monkeypatch.delenv(pdl_triton.ENV, raising=False)
    monkeypatch.setitem(pdl_launch._ARCH_BY_DEVICE, 0, 90)  # an sm_90 device 0, without asking CUDA
    dev = torch.device("cuda:0")
    with pdl_triton.step_launches(pdl_triton.AFTER_ATTENTION_OPS):
        assert pdl_triton.jit_launch_options(dev, "fused_attn_proj_residual") == {"PDL": 2, "launch_pdl": True}
        for qkv in pdl_triton.QKV_OPS:  # a plain launch: PDL's attribute only on the kernel that waits
            assert pdl_triton.jit_launch_options(dev, qkv) == {"PDL": pdl_triton.TRIGGER}
        assert pdl_triton.jit_launch_options(dev, "fused_norm_swiglu") == {}
        assert pdl_triton.jit_launch_options(dev) == {}
    with pdl_triton.step_launches(2):
        assert pdl_triton.jit_launch_options(dev, "fused_norm_swiglu") == {"PDL": 2, "launch_pdl": True}
