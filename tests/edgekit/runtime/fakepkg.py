"""A tiny stand-in plugin package, used ONLY to exercise the store's mechanics.

Format: b"FAKEPKG1\n" + base64(ed25519 signature over BODY) + b"\n" + BODY, where
BODY is canonical JSON {op, version, target_arch, abi_version, files: {name: base64}}.
The fake "kernel" is data too: kernel.txt holds a scale factor, golden.json holds
inputs and the outputs a correct kernel gives; `golden_check` runs one on the other,
so a subtly wrong scale fails the way a subtly wrong GPU kernel would.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from edgekit.runtime.plugin_policy import DevicePolicy, SwapRefused

MAGIC = b"FAKEPKG1\n"
KNOWN_ABI = {"rmsnorm": 1, "swiglu": 1}


def policy(arch: str = "sm_87", max_package_bytes: int = 1 << 20) -> DevicePolicy:
    return DevicePolicy(device_arch=arch, known_abi=KNOWN_ABI, triton_abis={"3"}, max_package_bytes=max_package_bytes)


@dataclass(frozen=True)
class FakePlugin:
    op: str
    version: object
    target_arch: str
    abi_version: int
    files: Mapping[str, bytes]
    triton_abi: str = "3"


def key_from_seed(seed: int) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32)


def pack(
    key: Ed25519PrivateKey,
    *,
    op: str = "rmsnorm",
    version: object = 2,
    arch: str = "sm_87",
    abi: int = 1,
    scale: float = 2.0,
    triton_abi: str = "3",
    extra_files: Mapping[str, bytes] | None = None,
) -> bytes:
    files = {
        "kernel.txt": f"scale={scale!r}\n".encode(),
        "golden.json": json.dumps({"inputs": [1.0, -2.5, 3.25], "outputs": [2.0, -5.0, 6.5]}).encode(),
        **(extra_files or {}),
    }
    body = json.dumps(
        {
            "op": op, "version": version, "target_arch": arch, "abi_version": abi, "triton_abi": triton_abi,
            "files": {n: base64.b64encode(b).decode() for n, b in files.items()},
        },
        sort_keys=True, separators=(",", ":"),
    ).encode()
    return MAGIC + base64.b64encode(key.sign(body)) + b"\n" + body


def public_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def verifier(*trusted: Ed25519PrivateKey):
    keys = [k.public_key() for k in trusted]

    def verify(data: bytes) -> FakePlugin:
        if not data.startswith(MAGIC) or data.count(b"\n") < 2:
            raise SwapRefused("corrupted", "not a FAKEPKG1 package")
        _, sig_b64, body = data.split(b"\n", 2)
        try:
            sig = base64.b64decode(sig_b64, validate=True)
        except ValueError as e:
            raise SwapRefused("corrupted", "signature line is not base64") from e
        signer = _find_signer(body, sig, keys)
        if signer is None:
            # Distinguish "some key signed this, not ours" from "bytes changed": try the
            # body against every key we know of in this test module's fixed seeds.
            for seed in range(1, 10):
                if _find_signer(body, sig, [key_from_seed(seed).public_key()]):
                    raise SwapRefused("untrusted_key", f"signed by test key #{seed}, which is not trusted")
            raise SwapRefused("bad_signature", "signature does not match the package bytes")
        doc = json.loads(body)
        return FakePlugin(
            op=doc["op"], version=doc["version"], target_arch=doc["target_arch"], abi_version=doc["abi_version"],
            files={n: base64.b64decode(b) for n, b in doc["files"].items()}, triton_abi=doc["triton_abi"],
        )

    return verify


def _find_signer(body: bytes, sig: bytes, keys: list[Ed25519PublicKey]):
    for k in keys:
        try:
            k.verify(sig, body)
            return k
        except InvalidSignature:
            continue
    return None


def golden_check(plugin: FakePlugin) -> None:
    scale = float(plugin.files["kernel.txt"].decode().strip().split("=", 1)[1])
    golden = json.loads(plugin.files["golden.json"])
    got = [scale * x for x in golden["inputs"]]
    worst = max(abs(g - w) for g, w in zip(got, golden["outputs"]))
    if worst > 1e-6:
        raise SwapRefused("golden_mismatch", f"max |out - golden| = {worst:.3g} > 1e-6")
