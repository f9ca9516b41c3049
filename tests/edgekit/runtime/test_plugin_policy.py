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
    version_number,
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


def test_json_writes_a_version_as_the_number_plugin_json_stores():
    assert [version_number(v) for v in (3, "3", " 12 ", None)] == [3, 3, 12, None]
    assert version_number("1.4.2") == "1.4.2"  # the store's rules admit it; no signed plugin carries one
    with pytest.raises(SwapRefused):
        version_number("../1")


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


# ---- issue 19: each admission rule on its own, and at its edges -----------------------------------------------------

from edgekit.runtime.plugin_policy import DevicePolicy, check_compatible, parse_version  # noqa: E402


@pytest.mark.parametrize("version, key", [
    (3, (3, 0, 0, 0)), ("3", (3, 0, 0, 0)), ("1.2", (1, 2, 0, 0)), ("1.2.3.4", (1, 2, 3, 4)), (" 7 ", (7, 0, 0, 0)),
    ("999999999", (999999999, 0, 0, 0)),
])
def test_version_keys_pad_to_four_numbers(version, key):
    assert version_key(version) == key
    assert parse_version(version) == key[: len(str(version).strip().split("."))]


@pytest.mark.parametrize("newer, older", [("2.0.0.1", "2"), ("2.0.1", "2.0"), ("1.0.0.0.0"[:7], "0.9.9.9"), ("3", "2.9")])
def test_newer_versions_compare_greater_whatever_their_spelling(newer, older):
    assert version_key(newer) > version_key(older)


@pytest.mark.parametrize("version", ["1000000000", "1.1000000000", "1.2.3.4.5"])
def test_versions_beyond_the_narrow_form_are_refused(version):
    with pytest.raises(SwapRefused, match="is not a non-negative integer or dotted integers"):
        canonical_version(version)


@pytest.mark.parametrize("value, message", [(True, "is a boolean"), (2.0, "has type float"), (None, "has type NoneType")])
def test_version_of_the_wrong_type_says_which(value, message):
    with pytest.raises(SwapRefused, match=message):
        canonical_version(value)


@pytest.mark.parametrize("spelling", ["sm_8", "sm_1000", "gfx90a", "sm_87ab", ""])
def test_arch_that_is_not_an_sm_name_is_refused(spelling):
    with pytest.raises(SwapRefused) as e:
        normalize_arch(spelling)
    assert e.value.reason == "schema"


@pytest.mark.parametrize("name, ok", [("rmsnorm", True), ("a" * 64, True), ("a" * 65, False), ("_x", False),
                                      ("RMSNorm", False), (3, False), ("9op", True)])
def test_operator_names_are_short_lower_case_identifiers(name, ok):
    if ok:
        assert check_name("operator", name) == name
    else:
        with pytest.raises(SwapRefused, match="is not a lower-case identifier"):
            check_name("operator", name)


@pytest.mark.parametrize("name, ok", [("kernel.cubin", True), ("a" * 128, True), ("a" * 129, False), (b"k", False),
                                      ("-rf", False), ("x.so", True)])
def test_slot_file_names_at_their_edges(name, ok):
    if ok:
        assert check_file_name(name) == name
    else:
        with pytest.raises(SwapRefused):
            check_file_name(name)


def test_attack_package_file_name_that_could_escape_the_slot_is_refused_by_admission():
    with pytest.raises(SwapRefused) as e:
        admit(plugin(files={"../active": b""}), fakepkg.policy(), OpState())
    assert e.value.reason == "schema" and "../active" in str(e.value)


@pytest.mark.parametrize("over, reason", [
    ({"target_arch": "sm_90"}, "wrong_arch"), ({"op": "conv2d"}, "unknown_op"), ({"abi_version": 2}, "unknown_abi"),
    ({"abi_version": True}, "unknown_abi"), ({"abi_version": "1"}, "unknown_abi"), ({"triton_abi": "2"}, "triton_abi"),
])
def test_each_compatibility_refusal_on_its_own(over, reason):
    with pytest.raises(SwapRefused) as e:
        check_compatible(plugin(**over), fakepkg.policy())
    assert e.value.reason == reason


def test_compatible_plugin_gives_its_op_and_canonical_version():
    assert check_compatible(plugin(version="03"[1:]), fakepkg.policy()) == ("rmsnorm", "3")
    assert check_compatible(plugin(target_arch="87"), fakepkg.policy(arch="SM_87")) == ("rmsnorm", "3")


def test_triton_abi_is_checked_only_when_both_sides_know_it():
    no_list = DevicePolicy(device_arch="sm_87", known_abi={"rmsnorm": 1}, triton_abis=None)
    assert check_compatible(plugin(triton_abi="2"), no_list) == ("rmsnorm", "3")
    assert check_compatible(plugin(triton_abi=None), fakepkg.policy()) == ("rmsnorm", "3")
    assert check_compatible(plugin(triton_abi=3), fakepkg.policy()) == ("rmsnorm", "3")  # compared as text


def test_admission_defaults_refuse_downgrades_and_blocked_versions():
    with pytest.raises(SwapRefused) as e:
        admit(plugin(version=2), fakepkg.policy(), OpState(active="3"))
    assert e.value.reason == "downgrade" and "--allow-downgrade" in e.value.hint
    with pytest.raises(SwapRefused) as e:
        admit(plugin(version=4), fakepkg.policy(), OpState(active="3", blocked=("4",)))
    assert e.value.reason == "blocked" and "higher version" in e.value.hint


@pytest.mark.parametrize("spelling", [3, "3.0"])
def test_the_active_version_again_is_not_sent_to_allow_downgrade(spelling):
    """Installing the active version again was told 'pass --allow-downgrade to install an older version on purpose';
    doing so was refused in turn ('already the active version', no hint). The hint now says there is nothing to
    install and how to replace it; an older version keeps the --allow-downgrade hint."""
    state = OpState(active="3")
    with pytest.raises(SwapRefused) as e:
        admit(plugin(version=spelling), fakepkg.policy(), state)
    assert e.value.reason == "downgrade" and "--allow-downgrade" not in e.value.hint
    assert "nothing to install" in e.value.hint and "higher --version" in e.value.hint
    with pytest.raises(SwapRefused) as e:
        admit(plugin(version=2), fakepkg.policy(), state)
    assert "--allow-downgrade" in e.value.hint
    assert admit(plugin(version=4), fakepkg.policy(), OpState(active="3", blocked=("5",))) == "4"
    assert admit(plugin(version=1), fakepkg.policy(), OpState()) == "1"  # the reference is older than anything


def test_reinstalling_the_previous_version_points_to_rollback():
    with pytest.raises(SwapRefused) as e:
        admit(plugin(version=1), fakepkg.policy(), OpState(active="2", previous="1"), allow_downgrade=True)
    assert "already the previous version" in str(e.value) and "rollback" in e.value.hint
    with pytest.raises(SwapRefused) as e:
        admit(plugin(version=2), fakepkg.policy(), OpState(active="2", previous="1"), allow_downgrade=True)
    assert "already the active version" in str(e.value) and e.value.hint is None


def test_announcement_ignores_unknown_and_empty_fields_but_not_disagreements():
    ok = admit(plugin(), fakepkg.policy(), OpState(), expect={"op": "rmsnorm", "version": None, "sha256": "ab", "length": 1})
    assert ok == "3"
    for key, value in (("op", "swiglu"), ("version", "3.0.1"), ("target_arch", "sm_90")):
        with pytest.raises(SwapRefused) as e:
            admit(plugin(), fakepkg.policy(), OpState(), expect={key: value})
        assert e.value.reason == "metadata_mismatch" and f"announced {key}=" in str(e.value)


def test_the_store_receive_limit_is_the_package_verifier_limit():
    """A store that accepted more than the verifier reads (or less than it allows) would refuse valid packages
    late, or buffer what the verifier refuses anyway."""
    from edgekit.bundle.plugin import MAX_PACKAGE_BYTES

    assert DevicePolicy(device_arch="sm_87", known_abi={}).max_package_bytes == MAX_PACKAGE_BYTES


def test_policy_and_state_cannot_be_changed_after_creation():
    import dataclasses

    for obj, field in ((fakepkg.policy(), "device_arch"), (OpState(), "active")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field, "x")


def test_refusal_reason_must_be_a_known_code():
    with pytest.raises(AssertionError):
        SwapRefused("made_up", "x")
    assert SwapRefused("blocked", "x").reason == "blocked"
