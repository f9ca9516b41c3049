"""Real signed rmsnorm plugin packages (edgekit.bundle.plugin format) for the store tests.

Kernels are stand-ins (an ELF header; PTX text naming the entry point): the store
and verifier check their hashes, never run them. Golden vectors are real: seeded
inputs and FP64 rmsnorm reference outputs.
"""

from __future__ import annotations

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgekit.bundle.golden import golden_to_bytes, make_case
from edgekit.bundle.keys import SigningKey, trust
from edgekit.bundle.plugin import PluginMetadata, pack_plugin

PROGRAM = {
    "format": 1, "op": "rmsnorm", "inputs": ["x", "weight"], "optional": [], "attrs": ["eps"],
    "checks": [{"cmp": "le", "a": {"shape": ["x", -1]}, "b": 1024, "what": "the hidden size fits BLOCK_C"}],
    "let": [],
    "buffers": [{"name": "y", "shape": [{"shape": ["x", 0]}, {"shape": ["x", 1]}], "dtype": {"like": "x"}}],
    "launches": [{
        "kernel": "rmsnorm_fwd", "grid": [{"shape": ["x", 0]}, 1, 1],
        "args": [{"ptr": "x"}, {"ptr": "weight"}, {"ptr": "y"}, {"stride": ["x", 0]}, {"shape": ["x", 1]}, {"attr": "eps"}],
    }],
    "outputs": ["y"],
}


def key(seed: int) -> SigningKey:
    return SigningKey(Ed25519PrivateKey.from_private_bytes(bytes([seed + 100]) * 32))


def trusted(*keys: SigningKey):
    return trust([k.public_key for k in keys])


def metadata(version: int, arch: int = 87, abi: int = 1) -> PluginMetadata:
    return PluginMetadata.model_validate({
        "format": "edgekit-plugin", "format_version": 1, "op": "rmsnorm", "version": version, "abi_version": abi,
        "arch": arch, "triton_version": "3.6.0", "hidden_args": 2,
        "kernels": [{
            "name": "rmsnorm_fwd", "symbol": "rmsnorm_fwd_kernel", "cubin": "kernel.cubin", "ptx": "kernel.ptx",
            "num_warps": 4, "num_stages": 1, "shared_bytes": 0, "global_scratch_bytes": 0,
            "constexprs": {"BLOCK_C": 1024}, "signature": ["*fp16", "*fp16", "*fp16", "i32", "i32", "fp32"],
        }],
        "launch": PROGRAM,
    })


def golden(seed: int = 0) -> bytes:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 64, generator=g, dtype=torch.float64).to(torch.float32)  # (T, C)
    w = (1 + 0.1 * torch.randn(64, generator=g, dtype=torch.float64)).to(torch.float32)  # (C,)
    return golden_to_bytes("rmsnorm", [make_case("rmsnorm", {"x": x, "weight": w}, {"eps": 1e-5}, name="t4", seed=seed, bucket=4)])


_GOLDEN = None


def pack(signer: SigningKey, version: int, *, arch: int = 87, abi: int = 1) -> bytes:
    global _GOLDEN
    if _GOLDEN is None:
        _GOLDEN = golden()
    files = {
        "kernel.cubin": b"\x7fELF\x02\x01\x01" + b"\x00" * 57 + b"stand-in cubin v%d" % version,
        "kernel.ptx": (
            f"//\n// stand-in PTX\n//\n.version 8.4\n.target sm_{arch}\n.address_size 64\n\n"
            ".visible .entry rmsnorm_fwd_kernel(\n\t.param .u64 rmsnorm_fwd_kernel_param_0\n)\n{\n\tret;\n}\n"
        ).encode(),
        "golden.safetensors": _GOLDEN,
    }
    return pack_plugin(metadata(version, arch, abi), files, signer)
