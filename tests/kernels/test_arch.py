"""kernels/arch.py: the one spelling of an arch ("sm_87") and the one list of archs edgekit compiles for, which the
target profiles, the plugin schema and the device's arch parser all agree with."""

from __future__ import annotations

import typing

import pytest

from edgekit.kernels.arch import SUPPORTED_ARCH_NAMES, SUPPORTED_ARCHS, arch_name, arch_number, arch_of_capability


def test_an_arch_is_spelled_sm_and_its_number():
    assert arch_name(87) == "sm_87" and arch_name(100) == "sm_100"
    assert arch_number("sm_87") == 87 and arch_number("sm_120") == 120
    assert SUPPORTED_ARCH_NAMES == ("sm_80", "sm_86", "sm_87", "sm_89", "sm_90")


def test_a_compute_capability_is_one_arch_number():
    # Orin (8.7), H100/H200 (9.0), Blackwell (10.0, 12.0): the minor digit never carries into the major
    assert [arch_of_capability(*cc) for cc in [(8, 7), (9, 0), (10, 0), (12, 0)]] == [87, 90, 100, 120]


@pytest.mark.parametrize("name", ["87", "sm87", "SM_87", "cuda:87", "sm_", "sm_87a", "sm_ 87", "sm_+87", "sm_８７"])
def test_arch_number_reads_only_what_arch_name_writes(name):
    with pytest.raises(ValueError):
        arch_number(name)


def test_the_plugin_schema_knows_every_arch_edgekit_compiles_for():
    # else a build would write a plugin.json its own schema refuses
    from edgekit.bundle.plugin import KNOWN_ARCHS, MAX_SHARED_BYTES_BY_ARCH

    assert set(SUPPORTED_ARCHS) <= KNOWN_ARCHS == set(MAX_SHARED_BYTES_BY_ARCH)


def test_a_target_profile_may_name_exactly_the_supported_archs():
    from edgekit.plan.targets import Gpu, discover_targets

    assert typing.get_args(Gpu.model_fields["arch"].annotation) == SUPPORTED_ARCH_NAMES
    for found in discover_targets().values():
        gpu = found.target.gpu
        assert gpu.arch == arch_name(gpu.compute_capability) and gpu.compute_capability in SUPPORTED_ARCHS


def test_the_device_s_arch_parser_round_trips_every_known_arch():
    from edgekit.bundle.plugin import KNOWN_ARCHS
    from edgekit.bundle.plugin_identity import normalize_arch

    for a in KNOWN_ARCHS:
        assert normalize_arch(arch_name(a)) == normalize_arch(a) == normalize_arch(f"cuda:{a}") == arch_name(a)
        assert arch_number(normalize_arch(a)) == a


def test_compiling_for_an_unsupported_arch_names_it_and_the_supported_ones():
    pytest.importorskip("triton")
    from edgekit.kernels.aot import KernelCompileError, compile_variant
    from edgekit.kernels.variants import default_variants

    v = next(iter(default_variants("rmsnorm").values()))
    with pytest.raises(KernelCompileError) as e:
        compile_variant(v, 75)
    assert e.value.message == "arch sm_75 is not supported; expected one of (80, 86, 87, 89, 90)"
