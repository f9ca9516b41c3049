"""Builders for small, real bundles and plugin packages (no GPU, no model download).

Kernels are stand-ins (an ELF header + PTX text naming the entry point): the
verification code checks their hashes, headers and entry symbols, never runs them.
Golden vectors are real: seeded inputs and the FP64 rmsnorm reference.
"""

from __future__ import annotations

from pathlib import Path

import torch

from edgekit.bundle.golden import golden_to_bytes, make_case
from edgekit.bundle.keys import SigningKey
from edgekit.bundle.manifest import Buckets, ModelIdentity, Target
from edgekit.bundle.plugin import PluginMetadata
from edgekit.bundle.writer import BundleWriter

ARCH = 87

RMSNORM_PROGRAM = {
    "format": 1,
    "op": "rmsnorm",
    "inputs": ["x", "weight"],
    "optional": [],
    "attrs": ["eps"],
    "checks": [{"cmp": "le", "a": {"shape": ["x", -1]}, "b": 1024, "what": "the hidden size fits BLOCK_C"}],
    "let": [],
    "buffers": [{"name": "y", "shape": [{"shape": ["x", 0]}, {"shape": ["x", 1]}], "dtype": {"like": "x"}}],
    "launches": [
        {
            "kernel": "rmsnorm_fwd",
            "grid": [{"shape": ["x", 0]}, 1, 1],
            "args": [{"ptr": "x"}, {"ptr": "weight"}, {"ptr": "y"}, {"stride": ["x", 0]}, {"shape": ["x", 1]}, {"attr": "eps"}],
        }
    ],
    "outputs": ["y"],
}


def rmsnorm_metadata(version: int = 1, arch: int = ARCH, **kernel_overrides) -> dict:
    kernel = {
        "kernel": "rmsnorm_fwd",
        "name": "rmsnorm_fwd_kernel",
        "cubin": "kernel.cubin",
        "ptx": "kernel.ptx",
        "num_warps": 4,
        "num_stages": 1,
        "shared_bytes": 0,
        "global_scratch_size": 0,
        "global_scratch_align": 1,
        "signature": [["x_ptr", "*fp16"], ["w_ptr", "*fp16"], ["y_ptr", "*fp16"], ["stride_xm", "i32"], ["N", "i32"], ["eps", "fp32"]],
        "constexprs": {"BLOCK_C": 1024},
    }
    kernel.update(kernel_overrides)
    return {
        "format": "edgekit-plugin",
        "format_version": 1,
        "op": "rmsnorm",
        "version": version,
        "abi_version": 1,
        "arch": arch,
        "triton_version": "3.6.0",
        "hidden_args": 2,
        "kernels": [kernel],
        "launch": RMSNORM_PROGRAM,
    }


def fake_cubin(tag: bytes = b"") -> bytes:
    return b"\x7fELF\x02\x01\x01" + b"\x00" * 57 + b"stand-in cubin " + tag


def fake_ptx(arch: int = ARCH, symbol: str = "rmsnorm_fwd_kernel") -> bytes:
    return (
        f"//\n// stand-in PTX\n//\n.version 8.4\n.target sm_{arch}\n.address_size 64\n\n"
        f".visible .entry {symbol}(\n\t.param .u64 {symbol}_param_0\n)\n{{\n\tret;\n}}\n"
    ).encode()


def rmsnorm_golden(seed: int = 0, dtype=torch.float32) -> bytes:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 64, generator=g, dtype=torch.float64).to(dtype)  # (T, C)
    w = (1 + 0.1 * torch.randn(64, generator=g, dtype=torch.float64)).to(dtype)  # (C,)
    case = make_case("rmsnorm", {"x": x, "weight": w}, {"eps": 1e-5}, name="t4", seed=seed, bucket=4)
    return golden_to_bytes("rmsnorm", [case])


def rmsnorm_plugin_files(arch: int = ARCH) -> dict[str, bytes]:
    return {"kernel.cubin": fake_cubin(), "kernel.ptx": fake_ptx(arch), "golden.safetensors": rmsnorm_golden()}


def write_bundle(out: Path, key: SigningKey, *, plugin_version: int = 1, weights: bytes = b"\x00" * 1000) -> Path:
    meta = PluginMetadata.model_validate(rmsnorm_metadata(plugin_version))
    with BundleWriter(out) as w:
        w.add_bytes("weights/model.safetensors", weights)
        w.add_bytes("tokenizer/tokenizer.json", b'{"model": "stand-in"}\n')
        w.add_json("plan.json", {"ops": {"rmsnorm": {"BLOCK_C": 1024}}})
        w.add_bytes("model.onnx", b"stand-in onnx")
        w.add_plugin(meta, rmsnorm_plugin_files())
        w.add_bytes("golden/rmsnorm.safetensors", rmsnorm_golden(seed=1))
        w.finish(
            key=key,
            target=Target(name="orin", arch=ARCH),
            model=ModelIdentity(name="tiny", source_kind="preset", seed=0),
            plan={"ops": {"rmsnorm": {"BLOCK_C": 1024}}},
            precision={"rmsnorm": "fp16"},
            buckets=Buckets(prompt_lengths=(32, 64), max_seq_len=128, batch=1),
            triton_version="3.6.0",
            edgekit_version="0.1.0",
        )
    return out


def resign(bundle: Path, key: SigningKey, mutate=None) -> None:
    """Re-list every file of a bundle in its manifest and sign it again, after `mutate(manifest_dict)`.

    Models an attacker who holds a signing key, or a buggy builder: the signature
    and hashes are then valid, so only the deeper checks can refuse the bundle.
    """
    import json

    from edgekit.bundle.archive import list_tree
    from edgekit.bundle.canonical import canonical_json, sha256_file

    doc = json.loads((bundle / "manifest.json").read_bytes())
    doc["files"] = {}
    for rel in list_tree(bundle):
        if rel not in ("manifest.json", "manifest.sig"):
            sha, size = sha256_file(bundle / rel)
            doc["files"][rel] = {"sha256": sha, "size": size}
    if mutate is not None:
        mutate(doc)
    data = canonical_json(doc)
    (bundle / "manifest.json").write_bytes(data)
    (bundle / "manifest.sig").write_bytes(key.sign(data))
