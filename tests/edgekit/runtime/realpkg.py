"""Real signed rmsnorm plugin packages (edgekit.bundle.plugin format) for the store tests.

The plugin metadata and files come from the bundle area's own test builders
(tests/edgekit/bundle/bundle_builders.py), so these packages follow the plugin schema
wherever it goes. Kernels there are stand-ins (hashes are checked, nothing runs);
golden vectors are real FP64 rmsnorm references.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgekit.bundle.keys import SigningKey, trust
from edgekit.bundle.plugin import PluginMetadata, pack_plugin

_BUILDERS = Path(__file__).resolve().parents[1] / "bundle" / "bundle_builders.py"


def _builders():
    if "bundle_builders" in sys.modules:  # the bundle tests' conftest loaded it in this session already
        return sys.modules["bundle_builders"]
    spec = importlib.util.spec_from_file_location("bundle_builders", _BUILDERS)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bundle_builders"] = module
    spec.loader.exec_module(module)
    return module


builders = _builders()


def key(seed: int) -> SigningKey:
    return SigningKey(Ed25519PrivateKey.from_private_bytes(bytes([seed + 100]) * 32))


def trusted(*keys: SigningKey):
    return trust([k.public_key for k in keys])


def golden(seed: int = 0) -> bytes:
    return builders.rmsnorm_golden(seed=seed)


_FILES: dict[int, dict[str, bytes]] = {}


def pack(signer: SigningKey, version: int, *, arch: int = 87, abi: int = 1) -> bytes:
    meta = builders.rmsnorm_metadata(version, arch=arch)
    meta["abi_version"] = abi
    if arch not in _FILES:
        _FILES[arch] = builders.rmsnorm_plugin_files(arch)
    files = dict(_FILES[arch])
    # each version gets its own cubin bytes, so slots of different versions differ on disk
    files["kernel.cubin"] = builders.fake_cubin(b"v%d" % version)
    return pack_plugin(PluginMetadata.model_validate(meta), files, signer)


def open_store(root, *, golden=None, max_bytes=1 << 20, checkpoint=None, author=None):
    """A store for an sm_87 device trusting `author` (key 1), with the real verifier and golden check."""
    from edgekit.runtime.plugin_checks import golden_checker, package_verifier
    from edgekit.runtime.plugin_policy import DevicePolicy
    from edgekit.runtime.plugin_store import PluginStore, default_known_abi

    return PluginStore.open(
        root,
        policy=DevicePolicy(device_arch="sm_87", known_abi=default_known_abi(), triton_abis={"3.6"}, max_package_bytes=max_bytes),
        verify=package_verifier(trusted(author or key(1))),
        golden_check=golden or golden_checker(),
        checkpoint=checkpoint,
    )


def compiled_rmsnorm_packages(author: SigningKey) -> tuple[int, bytes, bytes]:
    """On a GPU: (arch, a right rmsnorm plugin v1, v2 with a subtly wrong launch program: eps 0.05 instead of the
    call's 1e-5), both cross-compiled Triton with cubin for this GPU, signed by `author`."""
    import copy

    import torch

    from edgekit.bundle.golden import golden_to_bytes, make_case
    from edgekit.bundle.plugin import pack_plugin, plugin_from_compiled
    from edgekit.kernels import aot
    from edgekit.kernels.launcher import device_arch
    from edgekit.kernels.variants import default_variants, op_program

    arch = device_arch()
    variants = default_variants("rmsnorm", dtype="fp16", hidden=576)
    compiled = {k: aot.compile_variant(v, arch, with_ptxas_stats=False) for k, v in variants.items()}
    program = op_program("rmsnorm", variants, aot=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 576, generator=g).half()  # (T, C)
    w = (1 + 0.1 * torch.randn(576, generator=g)).half()  # (C,)
    golden = golden_to_bytes("rmsnorm", [make_case("rmsnorm", {"x": x, "weight": w}, {"eps": 1e-5}, name="t32", seed=0, bucket=32)])

    good = pack_plugin(*plugin_from_compiled("rmsnorm", 1, compiled, program, golden), author)
    wrong_program = copy.deepcopy(program)
    for launch in wrong_program["launches"]:
        launch["args"] = [0.05 if a == {"attr": "eps"} else a for a in launch["args"]]
    assert wrong_program != program
    wrong = pack_plugin(*plugin_from_compiled("rmsnorm", 2, compiled, wrong_program, golden), author)
    return arch, good, wrong
