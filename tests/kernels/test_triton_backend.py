"""The JIT path's operators pick their default tiles with what they know of the GPU a call runs on (no GPU needed:
the GPU's answers are stood in for; tests/kernels/test_triton_gpu.py asks a real one)."""

from __future__ import annotations

import torch

from edgekit.kernels import triton_backend
from edgekit.kernels.variants import default_variants

SM90_OPTIN = 232448  # 227 KB a block, as an H100 / H200 reports it


def _decode_call():
    """A decode attention call's canonical tensors and attributes, on shape-only ("meta") tensors."""
    q = torch.empty(1, 4, 128, dtype=torch.float16, device="meta")
    k = torch.empty(1, 2, 300, 128, dtype=torch.float16, device="meta")
    return triton_backend.TritonOp("attention_decode").kernels.prepare(q, k, torch.empty_like(k),
                                                                       torch.empty(1, dtype=torch.int32, device="meta"),
                                                                       None)


def _split_block(op, tensors, attrs) -> int:
    _, launchers = op._program_for("fp16", tensors, attrs)
    return launchers["attention_decode_split"].variant.constexprs["BLOCK_N"]


def test_a_jit_operator_takes_its_default_tiles_with_the_gpus_facts(monkeypatch):
    tensors, attrs, _ = _decode_call()
    assert _split_block(triton_backend.TritonOp("attention_decode"), tensors, attrs) == 64  # no GPU: orin-sized
    monkeypatch.setattr(triton_backend, "_device_facts", lambda tensors: {"shared_bytes_per_block": SM90_OPTIN})
    assert _split_block(triton_backend.TritonOp("attention_decode"), tensors, attrs) == 128
    # planned variants (a plan's choice, given) are not second-guessed by the facts
    planned = default_variants("attention_decode", head_dim=128, n_heads=4, n_kv_heads=2)
    assert _split_block(triton_backend.TritonOp("attention_decode", planned), tensors, attrs) == 64


def test_only_a_hopper_or_newer_gpu_reports_its_shared_memory_to_the_defaults(monkeypatch):
    """Longer key blocks were measured on an H100; an A100 or an Orin running the JIT path (163 KB a block) keeps the
    orin-sized defaults until measured there; a torch that does not report the opt-in size (before 2.7) tells none."""
    cuda0 = torch.device("cuda", 0)
    for arch, optin, want in ((90, SM90_OPTIN, {"shared_bytes_per_block": SM90_OPTIN}), (87, 166912, {}),
                              (90, 0, {})):
        monkeypatch.setattr(triton_backend, "device_properties",
                            lambda device, a=arch, o=optin: {"sm_count": 132, "max_shared_bytes": o, "arch": a})
        assert triton_backend.gpu_tile_facts(cuda0) == want, (arch, optin)
    # with an SM's shared memory (torch reports it): the SMs too, for the decode attention's stages (one wave)
    monkeypatch.setattr(triton_backend, "device_properties", lambda device: {
        "sm_count": 16, "max_shared_bytes": SM90_OPTIN, "shared_bytes_per_sm": 233472, "arch": 90})
    assert triton_backend.gpu_tile_facts(cuda0) == {"shared_bytes_per_block": SM90_OPTIN, "sms": 16,
                                                     "shared_bytes_per_sm": 233472}
