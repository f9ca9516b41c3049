"""The store's real verifier and golden check (edgekit.runtime.plugin_checks): refusals and their reason codes."""

from __future__ import annotations

import pytest

import realpkg
from edgekit.bundle.golden import golden_to_bytes, make_case, read_golden, run_reference
from edgekit.bundle.keys import development_key
from edgekit.bundle.plugin import PluginMetadata, pack_plugin
from edgekit.errors import EdgekitError, VerificationError
from edgekit.runtime.plugin_checks import (
    golden_checker,
    package_verifier,
    reference_runner,
    refusal_reason,
    runner_factory,
)
from edgekit.runtime.plugin_policy import SwapRefused

AUTHOR = realpkg.key(1)


@pytest.fixture(scope="module")
def plugin():
    return package_verifier(realpkg.trusted(AUTHOR))(realpkg.pack(AUTHOR, 2))


def _refused(check, plugin) -> SwapRefused:
    with pytest.raises(SwapRefused) as e:
        check(plugin)
    assert e.value.reason == "golden_mismatch"
    return e.value


@pytest.mark.parametrize("damaged", [b"", b"not safetensors at all", realpkg.golden()[:100]])
def test_attack_unreadable_bundle_golden_file_refuses_instead_of_being_skipped(plugin, damaged):
    """Without this refusal the check would silently fall back to the plugin's own vectors."""
    err = _refused(golden_checker(bundle_golden={"rmsnorm": damaged}), plugin)
    assert "bundle golden vectors unreadable" in str(err)


def test_attack_bundle_golden_file_for_another_operator_is_refused(plugin):
    import torch

    case = make_case("swiglu", {"gate_up": torch.randn(2, 8, dtype=torch.float64)}, {}, name="c", seed=0)
    err = _refused(golden_checker(bundle_golden={"rmsnorm": golden_to_bytes("swiglu", [case])}), plugin)
    assert "bundle golden vectors are for swiglu, the plugin is rmsnorm" in str(err)


def test_bundle_vectors_of_other_operators_are_not_run(plugin):
    seen = []

    def runner_for(p):
        def run(op, inputs, attrs, label):
            seen.append(label)
            return run_reference(op, inputs, attrs)

        return run

    golden_checker(runner_for, bundle_golden={"swiglu": b"never read"})(plugin)
    assert seen == ["ota:rmsnorm/2"]  # only the plugin's own case
    seen.clear()
    golden_checker(runner_for, bundle_golden={"rmsnorm": realpkg.golden(seed=4)})(plugin)
    assert seen == ["ota:rmsnorm/2", "ota:rmsnorm/2"]  # the plugin's case, then the bundle's


def test_attack_plugin_golden_file_that_does_not_parse_is_refused(plugin):
    """A signed plugin whose golden file has a valid header but damaged tensors (checked before any case runs)."""
    from dataclasses import replace

    bad = replace(plugin, files={**plugin.files, "golden.safetensors": realpkg.golden()[:-8]})
    assert "plugin golden vectors unreadable" in str(_refused(golden_checker(), bad))


def test_a_wrong_kernel_fails_with_where_and_how_far(plugin):
    def runner_for(p):
        return lambda op, inputs, attrs, label: run_reference(op, inputs, attrs) * 1.01

    err = _refused(golden_checker(runner_for), plugin)
    assert "rmsnorm 2, plugin case t4: output 'y' outside tolerance" in str(err) and "x the tolerance" in str(err)


def test_the_runner_is_unloaded_after_the_check_even_when_it_fails(plugin):
    unloaded = []

    def runner_for(p):
        def run(op, inputs, attrs, label):
            raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS")

        run.unload = lambda: unloaded.append(True)
        return run

    assert "ILLEGAL_ADDRESS" in str(_refused(golden_checker(runner_for), plugin))
    assert unloaded == [True]


def test_package_verifier_turns_verification_errors_into_reasons(tmp_path):
    verify = package_verifier(realpkg.trusted(AUTHOR), max_bytes=2000)
    with pytest.raises(SwapRefused) as e:
        verify(realpkg.pack(AUTHOR, 2))
    assert e.value.reason == "oversized"
    with pytest.raises(SwapRefused) as e:
        package_verifier(realpkg.trusted(AUTHOR))(realpkg.pack(realpkg.key(2), 2))
    assert e.value.reason == "untrusted_key"
    meta = PluginMetadata.model_validate(realpkg.builders.rmsnorm_metadata(3))
    dev = pack_plugin(meta, realpkg.builders.rmsnorm_plugin_files(), development_key())
    with pytest.raises(SwapRefused) as e:
        package_verifier(realpkg.trusted(AUTHOR))(dev)
    assert e.value.reason == "untrusted_key"
    assert package_verifier(realpkg.trusted(AUTHOR), allow_dev_key=True)(dev).dev_key


@pytest.mark.parametrize("file, reason, expected", [
    ("package", "1 bytes exceeds the 0-byte limit for a plugin package", "oversized"),
    ("package", "archive expands to more than 10 bytes", "corrupted"),  # "more than", not "exceeds ... limit"
    ("package:plugin.json", "kernel shared_bytes exceeds sm_87's 166912", "corrupted"),
    ("package:plugin.json", "schema: limit of 16 kernels", "schema"),
    ("package:package.sig", "signed with the public development key", "untrusted_key"),
    ("package:package.sig", "ed25519 signature does not match the bytes of index.json", "bad_signature"),
    ("package:plugin.json", "schema: triton_version 9.9 has no known kernel ABI", "triton_abi"),
    ("package:plugin.json", "format is 'x', expected 'edgekit-plugin'", "schema"),
    ("package:plugin.json", "not valid JSON (Expecting value)", "schema"),
    ("package:kernel.cubin", "sha256 0011... does not match the signed index", "corrupted"),
])
def test_each_verification_error_maps_to_its_refusal_reason(file, reason, expected):
    assert refusal_reason(VerificationError(file, reason)) == expected


def test_runner_factory_chooses_by_backend(monkeypatch):
    import torch

    assert runner_factory("cpu") is reference_runner
    with pytest.raises(EdgekitError, match="golden backend 'tpu' is not one of auto, cpu, gpu"):
        runner_factory("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runner_factory("auto") is reference_runner
    with pytest.raises(EdgekitError, match="needs a CUDA GPU"):
        runner_factory("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert runner_factory("auto") is not reference_runner  # the plugin's own kernels on the GPU


def test_reference_runner_checks_the_vectors_with_the_torch_reference(plugin):
    run = reference_runner(plugin)
    case = read_golden(plugin.golden).cases[0]
    out = run("rmsnorm", dict(case.inputs), dict(case.meta.attributes), None)
    assert out.shape == case.expected["y"].shape


def test_gpu_runner_loads_the_plugin_from_its_verified_bytes_and_unloads_it(plugin, monkeypatch):
    """The wiring around the launcher (which needs a GPU; tests/edgekit/runtime/test_store_gpu.py runs it there):
    the kernels come from the verified in-memory files, and the module is unloaded after the check."""
    import torch

    from edgekit.runtime import gpu_runner as gr
    from edgekit.runtime.plugin_checks import gpu_runner

    loaded, unloaded = [], []

    class FakeOp:
        def unload(self):
            unloaded.append(True)

    def fake_load(meta, read, device):
        loaded.append((meta, read("kernel.cubin"), device))
        return FakeOp()

    monkeypatch.setattr(gr, "load_plugin_op", fake_load)
    monkeypatch.setattr(gr, "call_with_spec_order", lambda op, name, inputs, attrs: run_reference(name, inputs, attrs))
    # which stream the check runs on is test_gpu_runner.py's subject; here the launch runs in place
    monkeypatch.setattr(gr, "on_own_stream", lambda dev, launch: launch())
    runner_for = gpu_runner("cpu")
    assert callable(runner_for)
    golden_checker(runner_for)(plugin)  # the reference stands in for the kernel: the vectors pass
    assert loaded == [(plugin.metadata, plugin.files["kernel.cubin"], torch.device("cpu"))] and unloaded == [True]


def test_auto_backend_with_a_gpu_gives_a_runner_factory(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert callable(runner_factory("auto")) and callable(runner_factory("gpu"))
