"""Admission rules, pure: names and versions that become paths, arch spelling, ordering of refusals."""

from __future__ import annotations

import pytest

import fakepkg
from edgekit.runtime.plugin_policy import (
    OpState,
    SwapRefused,
    admit,
    canonical_version,
    check_file_name,
    check_name,
    normalize_arch,
    version_key,
)


def plugin(**kw):
    base = dict(op="rmsnorm", version=3, target_arch="sm_87", abi_version=1, files={"kernel.txt": b""})
    base.update(kw)
    return fakepkg.FakePlugin(**base)


@pytest.mark.parametrize("name", ["../active", "a/b", ".hidden", "slot.json", "package.bin", "", "x" * 200, "k\x00.bin"])
def test_file_names_that_could_escape_or_clobber_the_slot_are_refused(name):
    with pytest.raises(SwapRefused) as e:
        check_file_name(name)
    assert e.value.reason == "schema"


@pytest.mark.parametrize("version", ["../../etc", "1/2", "-1", "01", "1.2.3.4.5", "1e3", " ", True, 1.5, None])
def test_versions_that_are_not_plain_numbers_are_refused(version):
    with pytest.raises(SwapRefused):
        canonical_version(version)


def test_versions_compare_numerically_not_as_text():
    assert version_key("1.10") > version_key("1.9")
    assert version_key(10) > version_key(9)
    assert version_key("2") == version_key("2.0.0")


@pytest.mark.parametrize("spelling", ["sm_87", "SM87", "87", 87, "cuda:87"])
def test_arch_spellings_normalize(spelling):
    assert normalize_arch(spelling) == "sm_87"


def test_op_names_that_are_paths_are_refused():
    with pytest.raises(SwapRefused) as e:
        admit(plugin(op="../rmsnorm"), fakepkg.policy(), OpState())
    assert e.value.reason == "schema"


def test_blocked_beats_newer_and_downgrade_beats_already_installed():
    state = OpState(active="2", previous="1", blocked=("3",))
    with pytest.raises(SwapRefused) as e:
        admit(plugin(version=3), fakepkg.policy(), state)
    assert e.value.reason == "blocked"
    assert admit(plugin(version=3), fakepkg.policy(), state, allow_blocked=True) == "3"
    with pytest.raises(SwapRefused) as e:
        admit(plugin(version=1), fakepkg.policy(), state)
    assert e.value.reason == "downgrade"
    with pytest.raises(SwapRefused) as e:
        admit(plugin(version=1), fakepkg.policy(), state, allow_downgrade=True)
    assert e.value.reason == "already_installed"
    assert admit(plugin(version=0), fakepkg.policy(), state, allow_downgrade=True) == "0"


def test_announced_metadata_must_match_the_package():
    with pytest.raises(SwapRefused) as e:
        admit(plugin(), fakepkg.policy(), OpState(), expect={"op": "rmsnorm", "version": "3", "target_arch": "sm_90"})
    assert e.value.reason == "metadata_mismatch" and "target_arch" in str(e.value)
    assert admit(plugin(), fakepkg.policy(), OpState(), expect={"op": "rmsnorm", "version": 3, "target_arch": "87"}) == "3"


# ---- issue 19: names that become path components match completely (Python's `$` accepts a final newline) ---------

@pytest.mark.parametrize("check", [
    lambda: check_name("operator", "rmsnorm\n"),
    lambda: check_file_name("kernel.txt\n"),
])
def test_attack_name_with_a_trailing_newline_is_refused(check):
    with pytest.raises(SwapRefused) as e:
        check()
    assert e.value.reason == "schema"
