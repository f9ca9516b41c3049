"""Variants, tile spaces, the shared-memory estimate and the ahead-of-time compile for sm_87 (no GPU needed)."""

from __future__ import annotations

import re

import pytest

from edgekit.errors import EdgekitError
from edgekit.kernels.abi import UnknownKernelABIError, hidden_args_for
from edgekit.kernels.aot import SharedMemoryBudgetError, compile_variant
from edgekit.kernels.variants import (
    KernelVariant, default_variants, estimate_shared_bytes, kernels_of, op_kernels, shared_memory_ops, tile_space,
    validate_variant,
)

ORIN_BUDGET = 131072  # 128 KB
# The Orin model shapes: SmolLM2-135M (d64, 9/3 heads, GQA 3) and a d128 model (Qwen2.5-1.5B: 12/2, GQA 6),
# at decode (1 row) and prefill (256 rows) buckets.
SHAPES = [
    dict(head_dim=64, n_heads=9, n_kv_heads=3, hidden_size=576, rows=1),
    dict(head_dim=64, n_heads=9, n_kv_heads=3, hidden_size=576, rows=256),
    dict(head_dim=128, n_heads=12, n_kv_heads=2, hidden_size=1536, rows=1),
    dict(head_dim=128, n_heads=12, n_kv_heads=2, hidden_size=1536, rows=256),
]


def _orin_variants() -> list[KernelVariant]:
    seen: dict[KernelVariant, None] = {}
    for shape in SHAPES:
        for op in op_kernels():
            for v in default_variants(op, **shape).values():
                seen[v] = None
    return list(seen)


@pytest.mark.parametrize("variant", _orin_variants(), ids=lambda v: v.label())
def test_default_variant_compiles_for_sm87_within_128kb(variant):
    ck = compile_variant(variant, 87, budget_bytes=ORIN_BUDGET)
    assert 0 <= ck.shared_bytes <= ORIN_BUDGET
    assert ck.cubin[:4] == b"\x7fELF"  # a real cubin (ELF)
    assert re.search(r"^\s*\.target\s+sm_87", ck.ptx, re.M)
    assert f".entry {ck.name}(" in ck.ptx
    # parameters in the PTX: the user arguments plus the hidden scratch pointers of this Triton ABI
    n_params = len(re.findall(rf"\.param\s+\.\w+(?:\s+\.ptr\s+\.global\s+\.align\s+\d+)?\s+{ck.name}_param_\d+",
                              ck.ptx))
    assert n_params == len(ck.signature) + ck.hidden_args
    assert ck.hidden_args == hidden_args_for(ck.triton_version)
    assert ck.num_warps == variant.num_warps and ck.block_threads == 32 * variant.num_warps
    assert ck.registers is not None and 0 < ck.registers <= 255
    assert ck.spills is not None
    assert set(ck.precision) == {"input", "accumulate", "output"}
    assert len(ck.launch_rule["grid"]) == 3 and len(ck.launch_rule["args"]) == len(ck.signature)


def test_shared_memory_estimate_tracks_the_compiler():
    # The estimate is for pruning: within 2x of the real number for the shared-memory kernels.
    for v in _orin_variants():
        if not validate_variant(v).uses_shared_memory:
            continue
        real, est = compile_variant(v, 87).shared_bytes, estimate_shared_bytes(v)
        assert real / 2 <= est <= 2 * real + 4096, (v.label(), real, est)


def test_budget_is_enforced_with_a_clear_error():
    v = default_variants("attention_prefill", head_dim=128)["attention_prefill_fwd"]
    real = compile_variant(v, 87).shared_bytes
    with pytest.raises(SharedMemoryBudgetError, match=rf"needs {real} bytes.*budget is {real - 1}") as e:
        compile_variant(v, 87, budget_bytes=real - 1)
    assert isinstance(e.value, EdgekitError)
    assert compile_variant(v, 87, budget_bytes=real).shared_bytes == real


def test_compile_cache_returns_the_same_result():
    v = default_variants("rmsnorm", hidden_size=576)["rmsnorm_fwd"]
    assert compile_variant(v, 87) is compile_variant(v, 87)
    assert compile_variant(v, 90).arch == 90 and compile_variant(v, 90) is not compile_variant(v, 87)


def test_compile_kernel_compiles_a_given_definition_and_leaves_the_shipped_compile_alone(tmp_path):
    from pathlib import Path

    from edgekit.builder.kernel_source import load_kernel_source
    from edgekit.kernels.aot import compile_kernel
    from edgekit.kernels.variants import kernel_def

    shipped = kernel_def("rmsnorm", "rmsnorm_fwd")
    text = Path(shipped.fn.fn.__code__.co_filename).read_text()
    assert "(x * rstd * w)" in text
    (tmp_path / "edited.py").write_text(text.replace("(x * rstd * w)", "(x * w * rstd)", 1))
    edited = load_kernel_source(tmp_path / "edited.py", "rmsnorm").kernels[0]
    v = default_variants("rmsnorm", hidden_size=576)["rmsnorm_fwd"]
    before = compile_variant(v, 87)
    mine = compile_kernel(edited, v, 87)
    assert mine.ptx != before.ptx and mine.variant == v and mine.signature == before.signature
    assert compile_variant(v, 87) is before  # an edited kernel never enters the cache of the shipped one
    with pytest.raises(SharedMemoryBudgetError, match=f"budget is {mine.shared_bytes - 1}"):
        compile_kernel(edited, v, 87, budget_bytes=mine.shared_bytes - 1)


def test_bigger_tiles_need_more_shared_memory():
    base = dict(head_dim=64)
    small = KernelVariant("attention_prefill", "attention_prefill_fwd", {"HEAD_DIM": 64, "BLOCK_M": 64, "BLOCK_N": 32}, 4, 2)
    big = KernelVariant("attention_prefill", "attention_prefill_fwd", {"HEAD_DIM": 64, "BLOCK_M": 128, "BLOCK_N": 128}, 8, 3)
    assert small in tile_space("attention_prefill", **base) and big in tile_space("attention_prefill", **base)
    assert compile_variant(small, 87).shared_bytes < compile_variant(big, 87).shared_bytes
    assert estimate_shared_bytes(small) < estimate_shared_bytes(big)


@pytest.mark.parametrize("op", sorted(op_kernels()))
def test_tile_space_is_valid_and_contains_the_default(op):
    shape = dict(head_dim=128, n_heads=32, n_kv_heads=8, hidden_size=4096, rows=1)
    space = tile_space(op, **shape)
    assert len(space) == len(set(space)) > 0
    assert {v.kernel for v in space} == set(kernels_of(op))
    for v in space:
        validate_variant(v)  # constexprs are exactly the kernel's
        assert v.op == op and v.dtype == "fp16"
        assert estimate_shared_bytes(v) >= 0
    for v in default_variants(op, **shape).values():
        assert v in space


SM90_OPTIN = 232448  # 227 KB: what an H100 / H200 lets one block opt in to


@pytest.mark.parametrize("op", ["attention_decode", "fused_attn_proj_residual", "fused_attn_proj"])
@pytest.mark.parametrize("head_dim, orin_block, sm90_block, sm90_fp32_block",
                         [(64, 128, 128, 128), (128, 64, 128, 64), (256, 32, 64, 32)])
def test_decode_attention_takes_the_longest_key_block_the_gpu_has_room_for(op, head_dim, orin_block, sm90_block,
                                                                          sm90_fp32_block):
    shape = dict(head_dim=head_dim, n_heads=8, n_kv_heads=2, n_out=256, k_in=8 * head_dim)
    split = next(k for k in kernels_of(op) if "split" in k)
    orin = default_variants(op, **shape)[split]  # no device: the orin profile's 128 KB
    sm90 = default_variants(op, **shape, shared_bytes_per_block=SM90_OPTIN)[split]
    fp32 = default_variants(op, dtype="fp32", **shape, shared_bytes_per_block=SM90_OPTIN)[split]
    assert (orin.constexprs["BLOCK_N"], sm90.constexprs["BLOCK_N"]) == (orin_block, sm90_block)
    assert fp32.constexprs["BLOCK_N"] == sm90_fp32_block  # twice the bytes an element
    assert sm90 in tile_space(op, **shape)
    assert compile_variant(sm90, 90).shared_bytes <= SM90_OPTIN  # what the device will be asked for
    assert compile_variant(orin, 87).shared_bytes <= ORIN_BUDGET


@pytest.mark.parametrize("op", ["attention_decode", "fused_attn_proj_residual", "fused_attn_proj"])
def test_decode_attention_stages_keep_the_most_programs_it_can_launch_in_one_wave(op):
    """The JIT default's stages follow the tile solver's split-KV rule where the GPU tells its SMs and an SM's shared
    memory (gpu_tile_facts): the fewest waves, then the deepest pipeline, a 4th stage only where two blocks fit an SM.
    An H100's 228 KB an SM holds two 4-stage blocks of 128 keys at head_dim 64 (104 KB), six 2-stage ones (38 KB), one
    4-stage block at head_dim 128 or 256 (205 KB): those keep 3 (measured: 4 lost 0.4-1.2% on 132 SMs)."""
    from edgekit.kernels.attention import decode_splits
    from edgekit.kernels.attention_triton import _decode_smem

    split = next(k for k in kernels_of(op) if "split" in k)
    h100 = dict(shared_bytes_per_block=SM90_OPTIN, shared_bytes_per_sm=233472)

    def stages(n_kv_heads: int, head_dim: int = 64, **facts) -> int:
        shape = dict(head_dim=head_dim, n_heads=4 * n_kv_heads, n_kv_heads=n_kv_heads, n_out=192,
                     k_in=4 * n_kv_heads * head_dim, rows=1)
        v = default_variants(op, **shape, **facts)[split]
        assert v in tile_space(op, **shape)
        block_n = v.constexprs["BLOCK_N"]
        if facts:  # an sm_90's room: the longest key block of 3 stages (test above), whatever the stages
            assert block_n == {64: 128, 128: 128, 256: 64}[head_dim]
        if facts.get("sms"):
            smem = _decode_smem(v.constexprs, 4, v.num_stages, 2)
            assert v.num_stages <= 3 or 2 * smem <= 233472
            if head_dim == 64:  # what it chose holds every program the launch rule can give it in one wave
                programs = decode_splits(facts["sms"], 1, n_kv_heads, 1 << 30, block_n, v.constexprs["MAX_SPLITS"])
                assert programs * n_kv_heads <= facts["sms"] * (233472 // smem)
        return v.num_stages

    assert stages(3) == stages(3, shared_bytes_per_block=SM90_OPTIN) == 3  # no SM facts: as before
    assert stages(3, sms=132, **h100) == stages(8, sms=132, **h100) == 4  # 192 / 128 programs: one wave of 264
    assert stages(3, sms=16, **h100) == stages(8, sms=16, **h100) == stages(3, sms=8, **h100) == 2  # 66 / 64 / 33
    # head_dim 128 / 256: 4 stages would be one block an SM; 3 hold the programs in one wave as well
    assert stages(8, 128, sms=132, **h100) == stages(1, 256, sms=132, **h100) == 3
    # 16 SMs: 64 programs; 2 stages (72 / 76 KB, three blocks an SM) take two waves, 3 stages (one block) four
    assert stages(8, 128, sms=16, **h100) == stages(1, 256, sms=16, **h100) == 2


def test_variant_is_hashable_and_round_trips():
    v = default_variants("attention_decode", head_dim=64, n_heads=32, n_kv_heads=8)["attention_decode_split"]
    assert v.constexprs["BLOCK_G"] == 16 and hash(v) == hash(KernelVariant.from_dict(v.to_dict()))
    assert KernelVariant.from_dict(v.to_dict()) == v
    with pytest.raises(TypeError):
        v.constexprs["BLOCK_N"] = 1  # type: ignore[index]


def test_shared_memory_ops_lists_the_tiled_operators():
    ops = shared_memory_ops()
    assert {"attention_prefill", "attention_decode", "qkv_rope", "linear", "linear_w8a16", "linear_w8a8"} <= set(ops)
    assert "rmsnorm" not in ops and "swiglu" not in ops


def test_bad_requests_are_clear_errors():
    with pytest.raises(EdgekitError, match="needs head_dim"):
        tile_space("attention_prefill")
    with pytest.raises(EdgekitError, match="no Triton kernels for operator 'conv'"):
        tile_space("conv", head_dim=64)
    bad = KernelVariant("rmsnorm", "rmsnorm_fwd", {"BLOCK_N": 64, "EXTRA": 1})
    with pytest.raises(EdgekitError, match="do not match"):
        compile_variant(bad, 87)
    with pytest.raises(EdgekitError, match="sm_75"):
        compile_variant(default_variants("swiglu")["swiglu_fwd"], 75)


def test_unknown_triton_abi_is_refused():
    assert hidden_args_for("3.6.0") == 2 and hidden_args_for("3.4.1") == 1
    with pytest.raises(UnknownKernelABIError, match="3.9"):
        hidden_args_for("3.9.0")
