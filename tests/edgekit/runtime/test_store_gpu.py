"""On a GPU: the store's golden gate runs a real compiled plugin's kernels before it may become active.

A correct rmsnorm plugin (cross-compiled Triton, cubin for this GPU) passes and is
installed; the same kernel with a subtly wrong launch program (eps 0.05 instead of
the call's 1e-5: a data-only bug, ~2% off) is refused and nothing changes.
"""

from __future__ import annotations

import copy

import pytest
from conftest import tree_digest

import realpkg
from edgekit.runtime.plugin_checks import golden_checker, gpu_runner, package_verifier
from edgekit.runtime.plugin_policy import DevicePolicy, SwapRefused
from edgekit.runtime.plugin_store import PluginStore, default_known_abi

pytestmark = pytest.mark.gpu
AUTHOR = realpkg.key(1)


def _plugin_packages():
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

    good = pack_plugin(*plugin_from_compiled("rmsnorm", 1, compiled, program, golden), AUTHOR)
    wrong_program = copy.deepcopy(program)
    for launch in wrong_program["launches"]:
        launch["args"] = [0.05 if a == {"attr": "eps"} else a for a in launch["args"]]
    assert wrong_program != program
    wrong = pack_plugin(*plugin_from_compiled("rmsnorm", 2, compiled, wrong_program, golden), AUTHOR)
    return arch, good, wrong


def test_gpu_golden_gate_accepts_a_right_kernel_and_refuses_a_subtly_wrong_one(tmp_path):
    arch, good, wrong = _plugin_packages()
    store = PluginStore.open(
        tmp_path / "store",
        policy=DevicePolicy(device_arch=f"sm_{arch}", known_abi=default_known_abi()),
        verify=package_verifier(realpkg.trusted(AUTHOR)),
        golden_check=golden_checker(gpu_runner()),
    )
    result = store.install(good)
    assert result.version == "1"
    print(f"measured on GPU sm_{arch}: install step ms {result.to_dict()['step_ms']}")
    before = tree_digest(store.root)
    with pytest.raises(SwapRefused) as e:
        store.install(wrong)
    assert e.value.reason == "golden_mismatch", str(e.value)
    print(f"refused as expected: {e.value}")
    assert tree_digest(store.root) == before
