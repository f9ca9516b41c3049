"""On a GPU: the store's golden gate runs a real compiled plugin's kernels before it may become active.

A correct rmsnorm plugin (cross-compiled Triton, cubin for this GPU) passes and is
installed; the same kernel with a subtly wrong launch program (eps 0.05 instead of
the call's 1e-5: a data-only bug, ~2% off) is refused and nothing changes.
"""

from __future__ import annotations

import pytest
from runtime_helpers import tree_digest

import realpkg
from edgekit.runtime.plugin_checks import golden_checker, gpu_runner, package_verifier
from edgekit.runtime.plugin_policy import DevicePolicy, SwapRefused
from edgekit.runtime.plugin_store import PluginStore, default_known_abi

pytestmark = pytest.mark.gpu
AUTHOR = realpkg.key(1)


def test_gpu_golden_gate_accepts_a_right_kernel_and_refuses_a_subtly_wrong_one(tmp_path):
    arch, good, wrong = realpkg.compiled_rmsnorm_packages(AUTHOR)
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
