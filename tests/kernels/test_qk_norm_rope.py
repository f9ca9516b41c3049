"""qk_norm_rope: Qwen3's and Gemma 3's QK-norm + RoPE, one registry operator (the reference against the FP64 oracle
is in test_references.py, its kernel under the interpreter in test_family_ops_interpreter.py)."""

from __future__ import annotations

import torch

from edgekit.builder.golden import golden_cases
from edgekit.kernels.aot import compile_variant
from edgekit.kernels.launch_count import launched_kernels
from edgekit.kernels.qk_norm_rope import SPEC, qk_norm_rope_reference
from edgekit.kernels.registry import OPERATORS
from edgekit.kernels.rmsnorm import rmsnorm_reference
from edgekit.kernels.rope import rope_frequencies, rope_reference
from edgekit.kernels.variants import default_variants
from edgekit.model.presets import preset_config


def test_reference_is_rmsnorm_of_each_q_and_k_head_then_rope_bit_for_bit():
    g = torch.Generator().manual_seed(2)
    B, T, hq, hkv, D = 2, 5, 4, 2, 32
    qkv = torch.randn(B, T, (hq + 2 * hkv) * D, generator=g).half()
    qn, kn = torch.randn(D, generator=g).half(), torch.randn(D, generator=g).half()
    cos, sin = rope_frequencies(D, T, 1e6)
    cos, sin = cos[None].expand(B, T, -1), sin[None].expand(B, T, -1)
    heads = qkv.view(B, T, hq + 2 * hkv, D).clone()
    heads[:, :, :hq] = rmsnorm_reference(heads[:, :, :hq], qn, 1e-6)
    heads[:, :, hq:hq + hkv] = rmsnorm_reference(heads[:, :, hq:hq + hkv], kn, 1e-6)
    want = rope_reference(heads.view(B, T, -1), cos, sin, hq, hkv)
    got = qk_norm_rope_reference(qkv, qn, kn, cos, sin, hq, hkv, 1e-6)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_registered_with_golden_cases_and_one_launch():
    op = OPERATORS["qk_norm_rope"]
    assert op.spec is SPEC and op.kernels.op == "qk_norm_rope" and op.onnx.op_type == "QKNormRope"
    cfg = preset_config("qwen3-0.6b")
    cases = golden_cases("qk_norm_rope", cfg, (16,), 128)
    assert [c.meta.name for c in cases] == ["qk_norm_rope_b16_r16"]
    assert set(cases[0].expected) == {"q", "k", "v"} and cases[0].expected["q"].shape == (1, 16, 16, 128)
    v = default_variants("qk_norm_rope", head_dim=128)
    W = (cfg.n_heads + 2 * cfg.n_kv_heads) * 128
    args = (torch.empty(1, 3, W, dtype=torch.float16, device="meta"), *(torch.empty(128, dtype=torch.float16,
            device="meta") for _ in range(2)), *(torch.empty(1, 3, 64, device="meta") for _ in range(2)), 16, 8, 1e-6)
    device = {"sm_count": 16, "max_shared_bytes": 166912}
    assert launched_kernels("qk_norm_rope", v, args, device) == ["qk_norm_rope_fwd"]


def test_cross_compiles_for_orin_within_the_shared_memory_budget_at_both_head_dims():
    for d in (128, 256):  # Qwen3's and Gemma 3's
        variant = default_variants("qk_norm_rope", head_dim=d)["qk_norm_rope_fwd"]
        ck = compile_variant(variant, 87, budget_bytes=128 * 1024)
        assert ck.arch == 87 and ck.shared_bytes <= 128 * 1024 and ck.ptx
