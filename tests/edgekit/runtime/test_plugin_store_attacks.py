"""The plugin store under attack: swapped slots, re-installs of the active version, size limits at their
edge, and the store's own errors (unreadable pointer, a slot that no longer verifies, a busy lock)."""

from __future__ import annotations

import fcntl
import io
import json
import os
import shutil

import pytest
from runtime_helpers import tree_digest

import fakepkg
from edgekit.runtime import plugin_store
from edgekit.runtime.plugin_policy import SwapRefused
from edgekit.runtime.plugin_store import StoreError

from test_plugin_store import AUTHOR, open_store, store  # noqa: F401  (store is a fixture)
from test_plugin_store import _two_versions as _versions_1_and_2


def _replace_slot(root, op, version, with_copy_of):
    """Every file of slot `version` replaced by a complete copy of another slot (a restored backup, a replay)."""
    shutil.rmtree(root / "ops" / op / version)
    shutil.copytree(root / "ops" / with_copy_of[0] / with_copy_of[1], root / "ops" / op / version)


def _edit_record(slot_dir, **changes):
    """Rewrite a slot's slot.json (not signed: the store must not trust it alone)."""
    record = json.loads((slot_dir / "slot.json").read_bytes())
    record.update(changes)
    (slot_dir / "slot.json").write_text(json.dumps(record))


# -- item 1: a slot folder holding a complete copy of another version's slot ------------------------------------------

def test_attack_slot_swapped_for_an_older_version_is_not_served_under_the_newer_name(tmp_path):
    """Every file of slot 2 replaced by slot 1's (a restored backup, or an attacker replaying a signed
    older plugin): each file still verifies on its own, but the slot is not what the pointer names."""
    root = tmp_path / "s"
    _versions_1_and_2(root)
    _replace_slot(root, "rmsnorm", "2", with_copy_of=("rmsnorm", "1"))
    s = open_store(root)
    p = s.pointer("rmsnorm")
    assert (p.version, p.previous, p.blocked) == ("1", None, ("2",))
    assert any("slot holds rmsnorm 1, not rmsnorm 2" in line for line in s.recovery), s.recovery
    assert s.load("rmsnorm").version == 1


def test_attack_slot_swapped_after_start_up_is_refused_when_loaded(tmp_path):
    root = tmp_path / "s"
    s = _versions_1_and_2(root)
    _replace_slot(root, "rmsnorm", "2", with_copy_of=("rmsnorm", "1"))
    with pytest.raises(StoreError, match="slot rmsnorm/2 failed verification: slot holds rmsnorm 1, not rmsnorm 2"):
        s.load("rmsnorm")


def test_attack_slot_record_relabelled_as_the_active_version_is_refused(tmp_path):
    """slot.json of slot 1 rewritten to say version 2 (package unchanged) and moved into slot 2's place."""
    root = tmp_path / "s"
    s = _versions_1_and_2(root)
    _replace_slot(root, "rmsnorm", "2", with_copy_of=("rmsnorm", "1"))
    _edit_record(root / "ops/rmsnorm/2", version="2")
    with pytest.raises(StoreError, match="slot holds rmsnorm 1, not rmsnorm 2"):
        s.load("rmsnorm")


def test_attack_slot_of_another_operator_is_refused(tmp_path):
    root = tmp_path / "s"
    s = open_store(root)
    s.install(fakepkg.pack(AUTHOR, op="swiglu", version=2))
    s.install(fakepkg.pack(AUTHOR, op="rmsnorm", version=2))
    _replace_slot(root, "rmsnorm", "2", with_copy_of=("swiglu", "2"))
    with pytest.raises(StoreError, match="slot holds swiglu 2, not rmsnorm 2"):
        s.load("rmsnorm")
    _edit_record(root / "ops/rmsnorm/2", op="rmsnorm")  # relabel the record too: the signed package still says swiglu
    with pytest.raises(StoreError, match="slot holds swiglu 2, not rmsnorm 2"):
        s.load("rmsnorm")


def test_attack_slot_record_naming_another_version_than_its_folder_is_refused(tmp_path):
    """The package in slot 2 is version 2, but its record claims another slot: not a consistent slot."""
    root = tmp_path / "s"
    s = _versions_1_and_2(root)
    for key, value in (("version", "1"), ("op", "swiglu")):
        _edit_record(root / "ops/rmsnorm/2", **{"version": "2", "op": "rmsnorm", key: value})
        with pytest.raises(StoreError, match="slot holds rmsnorm 2, not rmsnorm 2"):
            s.load("rmsnorm")


# -- item 2: re-installing the active version ----------------------------------------------------------------------

@pytest.mark.parametrize("spelling", [2, "2", "2.0", "2.0.0", "2.0.0.0"])
def test_attack_reinstalling_the_active_version_in_any_spelling_is_a_downgrade(store, spelling):
    store.install(fakepkg.pack(AUTHOR, version=2))
    before = tree_digest(store.root)
    with pytest.raises(SwapRefused) as e:
        store.install(fakepkg.pack(AUTHOR, version=spelling))
    assert e.value.reason == "downgrade", str(e.value)
    assert "is not newer than the active version 2" in str(e.value)
    assert tree_digest(store.root) == before


def test_reinstalling_the_active_version_with_allow_downgrade_is_already_installed(store):
    store.install(fakepkg.pack(AUTHOR, version=2))
    with pytest.raises(SwapRefused) as e:
        store.install(fakepkg.pack(AUTHOR, version=2), allow_downgrade=True)
    assert e.value.reason == "already_installed" and "already the active version" in str(e.value)


def test_the_next_version_up_is_admitted(store):
    store.install(fakepkg.pack(AUTHOR, version="2.0"))
    store.install(fakepkg.pack(AUTHOR, version="2.0.1"))
    assert store.pointer("rmsnorm").version == "2.0.1"


# -- item 6: the receive limit at its edge --------------------------------------------------------------------------

def _package_of_exactly(n_bytes: int) -> bytes:
    base = len(fakepkg.pack(AUTHOR, version=2, extra_files={"p": b""}))
    raw = (n_bytes - base) * 3 // 4 - 6  # base64 grows by 4/3, in steps of 4 bytes ...
    for name_len in range(1, 16):  # ... and the pad file's name closes the gap one byte at a time
        data = fakepkg.pack(AUTHOR, version=2, extra_files={"p" * name_len: b"\0" * raw})
        if len(data) == n_bytes:
            return data
    pytest.fail(f"no package of exactly {n_bytes} bytes")


@pytest.mark.parametrize("as_stream", [False, True])
def test_package_of_exactly_the_limit_is_received_and_one_byte_more_is_oversized(tmp_path, as_stream):
    limit = 8192
    store = open_store(tmp_path / "s", policy=fakepkg.policy(max_package_bytes=limit))
    wrap = io.BytesIO if as_stream else (lambda b: b)
    assert store.install(wrap(_package_of_exactly(limit))).version == "2"
    store.rollback("rmsnorm")
    with pytest.raises(SwapRefused) as e:
        store.install(wrap(_package_of_exactly(limit + 1)))
    assert e.value.reason == "oversized"
    assert list((store.root / "tmp").iterdir()) == []


def test_package_read_from_a_path_is_received(store, tmp_path):
    path = tmp_path / "pkg.bin"
    path.write_bytes(fakepkg.pack(AUTHOR, version=2))
    assert store.install(path).version == "2"
    with pytest.raises(StoreError, match="cannot read plugin package"):
        store.install(tmp_path / "missing.bin")


# -- item 7: the store's own errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("damage", [
    b'{"version": ',  # torn write
    b'{"format": 1, "op": "rmsnorm", "version": "2", "surprise": 1}',  # not the pointer schema
    b"\xff\xfe not utf-8",
])
def test_unreadable_pointer_is_an_error_until_recovery_repairs_it(tmp_path, damage):
    root = tmp_path / "s"
    s = _versions_1_and_2(root)
    (root / "ops/rmsnorm/active").write_bytes(damage)
    for call in (lambda: s.pointer("rmsnorm"), lambda: s.load("rmsnorm"), lambda: s.status(),
                 lambda: s.install(fakepkg.pack(AUTHOR, version=3)), lambda: s.confirm("rmsnorm"),
                 lambda: s.rollback("rmsnorm")):
        with pytest.raises(StoreError, match="pointer of rmsnorm is unreadable") as e:
            call()
        assert "restart the runtime" in (e.value.hint or "")
    s2 = open_store(root)
    assert s2.pointer("rmsnorm").version is None
    assert any("pointer unreadable" in line for line in s2.recovery)


def test_attack_pointer_copied_from_another_operator_is_unreadable(tmp_path):
    root = tmp_path / "s"
    s = open_store(root)
    s.install(fakepkg.pack(AUTHOR, op="swiglu", version=2))
    s.install(fakepkg.pack(AUTHOR, op="rmsnorm", version=3))
    shutil.copy(root / "ops/swiglu/active", root / "ops/rmsnorm/active")
    with pytest.raises(StoreError, match="pointer names operator 'swiglu' but lives under 'rmsnorm'"):
        s.pointer("rmsnorm")
    s2 = open_store(root)
    assert s2.pointer("rmsnorm").version is None and s2.pointer("swiglu").version == "2"


def test_slot_failing_verification_after_start_up_is_refused_when_loaded(tmp_path):
    root = tmp_path / "s"
    s = _versions_1_and_2(root)
    (root / "ops/rmsnorm/2/kernel.txt").write_bytes(b"scale=2.5\n")
    with pytest.raises(StoreError, match="slot rmsnorm/2 failed verification: kernel.txt does not match") as e:
        s.load("rmsnorm")
    assert "restart" in (e.value.hint or "")
    assert s.load("rmsnorm", "1").version == 1  # the untouched previous slot still loads


@pytest.mark.parametrize("damage, problem", [
    (lambda slot: (slot / "slot.json").unlink(), "slot record or package unreadable"),
    (lambda slot: (slot / "package.bin").unlink(), "slot record or package unreadable"),
    (lambda slot: (slot / "slot.json").write_text("{}"), "slot record or package unreadable"),
    (lambda slot: (slot / "package.bin").write_bytes(b"garbage"), "package.bin does not match its recorded sha256"),
    (lambda slot: (slot / "extra.txt").write_bytes(b"x"), "slot files differ from the package (extra/missing: ['extra.txt'])"),
    (lambda slot: (slot / "golden.json").unlink(), "slot files differ from the package (extra/missing: ['golden.json'])"),
    (lambda slot: shutil.rmtree(slot), "slot directory missing"),
])
def test_damaged_slot_is_refused_with_its_problem(tmp_path, damage, problem):
    root = tmp_path / "s"
    s = _versions_1_and_2(root)
    damage(root / "ops/rmsnorm/2")
    with pytest.raises(StoreError) as e:
        s.load("rmsnorm")
    assert problem in str(e.value)
    s2 = open_store(root)  # recovery falls back to the previous version and says why
    assert s2.pointer("rmsnorm").version == "1"
    assert any(problem in line for line in s2.recovery), s2.recovery


def test_slot_record_listing_other_files_than_the_package_is_refused(tmp_path):
    root = tmp_path / "s"
    s = _versions_1_and_2(root)
    slot = root / "ops/rmsnorm/2"
    files = json.loads((slot / "slot.json").read_bytes())["files"]
    _edit_record(slot, files={**files, "kernel.txt": "0" * 64})
    with pytest.raises(StoreError, match="slot record lists other files than the signed package"):
        s.load("rmsnorm")


def test_slot_whose_signer_is_revoked_is_refused_with_the_reason(tmp_path):
    root = tmp_path / "s"
    _versions_1_and_2(root)
    s = open_store(root, verify=fakepkg.verifier(fakepkg.key_from_seed(2)))
    assert s.pointer("rmsnorm").version is None
    assert any("no longer verifies or no longer fits this runtime (untrusted_key)" in line for line in s.recovery)


@pytest.mark.parametrize("opener", [
    dict(verify=fakepkg.verifier(fakepkg.key_from_seed(2))),  # a --trust that names another key
    dict(policy=fakepkg.policy(arch="sm_90")),  # a --target of another arch
    # an edgekit whose rmsnorm speaks ABI 2 (another version run by hand on the device)
    dict(policy=plugin_store.DevicePolicy(device_arch="sm_87", known_abi={"rmsnorm": 2, "swiglu": 1})),
], ids=["untrusted_key", "wrong_arch", "unknown_abi"])
def test_a_command_opening_intact_plugins_it_refuses_is_refused_and_changes_nothing(tmp_path, opener):
    """A command run by hand (refuse_policy_drops) with a mistyped --trust / --target, or another edgekit version:
    recovery would drop, block and delete the intact versions the device serves, a revocation nobody asked for. It
    is refused before anything is touched; the runtime's own start (the default) still revokes, as the signer test
    above holds."""
    root = tmp_path / "s"
    _versions_1_and_2(root)
    before = tree_digest(root)
    with pytest.raises(StoreError, match=r"rmsnorm 2: package no longer verifies .*\((untrusted_key|wrong_arch|unknown_abi)"
                                         r"\); rmsnorm 1: .*Nothing was changed") as e:
        open_store(root, refuse_policy_drops=True, **opener)
    assert e.value.exit_code == 2 and "--trust" in e.value.hint and "restart `edgekit serve`" in e.value.hint
    assert tree_digest(root) == before
    s = open_store(root, refuse_policy_drops=True)  # the right key and arch: as installed, nothing blocked
    assert s.pointer("rmsnorm").version == "2" and not s.pointer("rmsnorm").blocked and not s.recovery


def test_a_command_opening_a_pointer_another_edgekit_wrote_is_refused_and_changes_nothing(tmp_path):
    """A pointer with a field this edgekit does not know (a newer one wrote it) is not damage: repairing it reset
    the operator to the reference and deleted every slot."""
    root = tmp_path / "s"
    _versions_1_and_2(root)
    path = root / "ops/rmsnorm" / plugin_store.POINTER_FILE
    path.write_bytes(json.dumps({**json.loads(path.read_bytes()), "from_the_future": 1}).encode())
    before = tree_digest(root)
    with pytest.raises(StoreError, match="rmsnorm: its pointer is one this edgekit cannot read"):
        open_store(root, refuse_policy_drops=True)
    assert tree_digest(root) == before


@pytest.mark.parametrize("untrusted", [False, True])
def test_a_command_opening_a_damaged_slot_still_recovers_it(tmp_path, untrusted):
    """refuse_policy_drops spares only intact slots: damaged bytes are recovered from as ever, also where the opener
    would refuse the signer too (the damage is checked before the refusal is read as the opener's)."""
    root = tmp_path / "s"
    _versions_1_and_2(root)
    (root / "ops/rmsnorm/2/kernel.txt").write_bytes(b"scale=2.5\n")
    kw = dict(verify=fakepkg.verifier(fakepkg.key_from_seed(2))) if untrusted else {}
    if untrusted:  # version 1 is intact and refused: the command stops, naming it (and not 2, which is damaged)
        with pytest.raises(StoreError, match=r"rmsnorm 1: .*Nothing was changed") as e:
            open_store(root, refuse_policy_drops=True, **kw)
        assert "rmsnorm 2" not in str(e.value)
        return
    s = open_store(root, refuse_policy_drops=True)
    assert s.pointer("rmsnorm").version == "1" and "2" in s.pointer("rmsnorm").blocked


def test_slot_for_an_abi_this_runtime_no_longer_speaks_is_dropped_at_start_up(tmp_path):
    """An edgekit upgrade moved rmsnorm to ABI 2: the installed ABI-1 slots must not be served."""
    root = tmp_path / "s"
    _versions_1_and_2(root)
    policy = plugin_store.DevicePolicy(device_arch="sm_87", known_abi={"rmsnorm": 2, "swiglu": 1})
    s = open_store(root, policy=policy)
    assert s.pointer("rmsnorm").version is None
    assert any("(unknown_abi)" in line for line in s.recovery)


def test_busy_store_lock_times_out_with_a_clear_error(store, monkeypatch):
    monkeypatch.setattr(plugin_store, "LOCK_TIMEOUT_S", 0.3)
    import threading

    fd = os.open(store.root / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process in the middle of a swap ...
    release = threading.Timer(5.0, fcntl.flock, (fd, fcntl.LOCK_UN))  # ... for 5 s: a store that waited on
    release.start()  # past its timeout gets the lock then, and the test fails instead of hanging
    try:
        with pytest.raises(StoreError, match="stayed locked") as e:
            store.install(fakepkg.pack(AUTHOR, version=2))
        assert "retry later" in e.value.hint
    finally:
        release.cancel()
        os.close(fd)
    assert store.install(fakepkg.pack(AUTHOR, version=2)).version == "2"  # free again: the swap goes through


def test_store_that_cannot_be_created_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StoreError, match="cannot create the plugin store") as e:
        open_store(tmp_path / "file" / "store")
    assert "--store" in e.value.hint


def test_status_lists_every_operator_with_its_pointer(store):
    store.install(fakepkg.pack(AUTHOR, op="swiglu", version=1))
    store.install(fakepkg.pack(AUTHOR, op="rmsnorm", version=2))
    store.rollback("rmsnorm", "test")
    rows = {r["op"]: r for r in store.status()}
    assert set(rows) == {"rmsnorm", "swiglu"}
    assert (rows["rmsnorm"]["version"], rows["rmsnorm"]["blocked"]) == (None, [2])
    assert (rows["swiglu"]["version"], rows["swiglu"]["state"]) == (1, "probation")


def test_confirm_of_a_confirmed_version_changes_nothing(store):
    store.install(fakepkg.pack(AUTHOR, version=2))
    store.confirm("rmsnorm")
    before = tree_digest(store.root)
    assert store.confirm("rmsnorm").state == "confirmed"
    assert tree_digest(store.root) == before


# -- the verifier's and the golden check's failures become the right refusals ----------------------------------------

from edgekit.errors import EdgekitError, VerificationError  # noqa: E402
from edgekit import durable  # noqa: E402
from edgekit.runtime.plugin_store import _reason_for  # noqa: E402


@pytest.mark.parametrize("text, reason", [
    ("signed by a key that is not trusted", "untrusted_key"), ("untrusted signer", "untrusted_key"),
    ("bad signature", "bad_signature"), ("schema: field required", "schema"), ("plugin.json is odd", "schema"),
    ("hash differs", "corrupted"), ("sha256 differs", "corrupted"), ("not a tar", "corrupted"),
    ("corrupt member", "corrupted"), ("truncated", "corrupted"), ("something else", "verification_failed"),
])
def test_verifier_error_wording_maps_to_a_reason(text, reason):
    assert _reason_for(EdgekitError(text)) == reason


def test_verifier_error_with_its_own_reason_code_keeps_it():
    e = EdgekitError("signature")
    e.reason_code = "wrong_arch"
    assert _reason_for(e) == "wrong_arch"
    e.reason_code = "not_a_reason"
    assert _reason_for(e) == "bad_signature"


@pytest.mark.parametrize("raised, reason", [
    (SwapRefused("oversized", "too big for the verifier"), "oversized"),  # passed through, not re-read from its text
    (VerificationError("package.sig", "signed by key ab..., which is not trusted"), "untrusted_key"),
    (ValueError("unexpected end of data"), "corrupted"),  # untrusted bytes that do not even parse
])
def test_whatever_the_verifier_raises_is_a_refusal_that_changes_nothing(store, raised, reason):
    def verify(data):
        raise raised

    s = open_store(store.root, verify=verify)
    before = tree_digest(s.root)
    with pytest.raises(SwapRefused) as e:
        s.install(fakepkg.pack(AUTHOR, version=2))
    assert e.value.reason == reason
    assert tree_digest(s.root) == before and s.events[-1].kind == "refused"


def test_a_golden_check_refusal_keeps_its_own_reason(store):
    def cannot_load(plugin):
        raise SwapRefused("load_failed", "cuModuleLoadData failed")

    with pytest.raises(SwapRefused) as e:
        store.install(fakepkg.pack(AUTHOR, version=2), golden_check=cannot_load)
    assert e.value.reason == "load_failed"


def test_without_a_golden_check_the_plugin_is_staged_unchecked(tmp_path):
    s = open_store(tmp_path / "s", golden_check=None)
    assert s.install(fakepkg.pack(AUTHOR, version=2, scale=2.001)).version == "2"


def test_the_per_install_golden_check_replaces_the_store_default(store):
    calls = []
    store.install(fakepkg.pack(AUTHOR, version=2, scale=2.001), golden_check=calls.append)  # its own check passes
    assert [p.version for p in calls] == [2]


# -- the swap's steps and its failures --------------------------------------------------------------------------------

def test_staging_partial_means_exactly_one_file_written(tmp_path):
    seen = []

    def checkpoint(action, step):
        if step == "staging_partial":
            staging = tmp_path / "s/ops/rmsnorm/2.staging"
            seen.append(sorted(p.name for p in staging.iterdir()))

    s = open_store(tmp_path / "s", checkpoint=checkpoint)
    s.install(fakepkg.pack(AUTHOR, version=2, extra_files={"a.bin": b"a", "b.bin": b"b"}))
    assert seen == [["a.bin"]]


def test_a_failure_while_writing_the_slot_leaves_nothing_behind(store, monkeypatch):
    store.install(fakepkg.pack(AUTHOR, version=1))
    before = tree_digest(store.root)
    real = durable.write_new_file

    def disk_full(path, data, *a, **kw):
        if path.name == "kernel.txt":
            raise OSError(28, "No space left on device")
        return real(path, data, *a, **kw)

    monkeypatch.setattr(durable, "write_new_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        store.install(fakepkg.pack(AUTHOR, version=2))
    assert tree_digest(store.root) == before


def test_a_failure_before_the_switch_removes_the_staged_slot(tmp_path):
    def fail_at(action, step):
        if step == "pointer_temp_written":
            raise RuntimeError("power cut simulated as an exception")

    s = open_store(tmp_path / "s")
    s.install(fakepkg.pack(AUTHOR, version=1))
    before = tree_digest(s.root)
    s2 = open_store(tmp_path / "s", checkpoint=fail_at)
    with pytest.raises(RuntimeError):
        s2.install(fakepkg.pack(AUTHOR, version=2))
    assert not (s.root / "ops/rmsnorm/2").exists()
    assert {k: v for k, v in tree_digest(s.root).items() if not durable.is_temp_name(k.rsplit("/", 1)[-1])} == before


def test_an_unreferenced_slot_left_by_a_failed_install_is_replaced(store):
    store.install(fakepkg.pack(AUTHOR, version=1))
    (store.root / "ops/rmsnorm/2").mkdir()
    (store.root / "ops/rmsnorm/2/junk").write_bytes(b"from an install that failed after staging")
    (store.root / "ops/rmsnorm/2.staging").mkdir()
    store.install(fakepkg.pack(AUTHOR, version=2))
    assert not (store.root / "ops/rmsnorm/2/junk").exists() and store.load("rmsnorm").version == 2


def test_a_caller_s_stream_is_not_closed_by_the_store(store):
    stream = io.BytesIO(fakepkg.pack(AUTHOR, version=2))
    store.install(stream)
    assert not stream.closed


def test_results_and_events_report_what_happened(store):
    r = store.install(fakepkg.pack(AUTHOR, version=2)).to_dict()
    assert (r["op"], r["version"], r["previous"], r["state"]) == ("rmsnorm", 2, None, "probation")
    assert all(v == round(v, 3) for v in r["step_ms"].values()) and list(r["step_ms"])[0] == "received"
    store.rollback("rmsnorm", "watchdog")
    kinds = [(e.kind, e.detail) for e in store.events]
    assert kinds == [("installed", "2 on probation (previous reference)"), ("rolled_back", "2 (store) -> reference: watchdog")]
    d = store.events[0].to_dict()
    assert (d["kind"], d["op"]) == ("installed", "rmsnorm") and d["at"]


def test_records_and_pointers_cannot_be_changed_in_memory(store):
    import dataclasses

    from pydantic import ValidationError

    store.install(fakepkg.pack(AUTHOR, version=2))
    with pytest.raises(ValidationError):
        store.pointer("rmsnorm").version = "9"  # type: ignore[misc]
    active = store.active("rmsnorm")
    with pytest.raises(dataclasses.FrozenInstanceError):
        active.version = "9"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        store.events[0].kind = "x"  # type: ignore[misc]
    record = plugin_store.SlotRecord.model_validate_json((active.slot_dir / "slot.json").read_bytes())
    with pytest.raises(ValidationError):
        record.version = "9"  # type: ignore[misc]


def test_rolling_back_a_blocked_version_again_does_not_list_it_twice(store):
    store.install(fakepkg.pack(AUTHOR, version=2))
    store.rollback("rmsnorm")
    store.install(fakepkg.pack(AUTHOR, version=2), allow_blocked=True)
    assert store.rollback("rmsnorm").blocked == ("2",)


def test_the_lock_file_is_not_writable_by_others(tmp_path):
    old = os.umask(0)
    try:
        s = open_store(tmp_path / "s")
    finally:
        os.umask(old)
    assert os.stat(s.root / ".lock").st_mode & 0o777 == 0o644


def test_store_root_is_created_with_its_parents(tmp_path):
    s = open_store(tmp_path / "a" / "b" / "store")
    assert s.ops() == [] and (s.root / "tmp").is_dir()


# -- start-up recovery, each repair on its own -------------------------------------------------------------------------

def test_open_removes_interrupted_staging_and_temp_leftovers(tmp_path):
    root = tmp_path / "s"
    s = _versions_1_and_2(root)
    (root / "ops/rmsnorm/3.staging").mkdir()
    leftover = durable.temp_name(root / "ops/rmsnorm/active")
    leftover.write_bytes(b"half a pointer")
    op_leftover = durable.temp_name(root / "ops/conv")
    op_leftover.mkdir()
    (root / "tmp/received.partial").write_bytes(b"x")
    (root / "ops/README").write_bytes(b"a stray file is not an operator")
    s = open_store(root)
    assert sorted(p.name for p in (root / "ops/rmsnorm").iterdir()) == ["1", "2", "active"]
    assert not op_leftover.exists() and list((root / "tmp").iterdir()) == []
    assert any("removed interrupted 3.staging" in line for line in s.recovery)
    assert any(f"removed interrupted {leftover.name}" in line for line in s.recovery)
    assert s.ops() == ["rmsnorm"] and [r["op"] for r in s.status()] == ["rmsnorm"]
    assert [e.kind for e in s.events] == ["recovered"] * len(s.recovery)


def test_open_drops_a_previous_version_that_no_longer_verifies(tmp_path):
    root = tmp_path / "s"
    _versions_1_and_2(root)
    (root / "ops/rmsnorm/1/kernel.txt").write_bytes(b"scale=9\n")
    s = open_store(root)
    p = s.pointer("rmsnorm")
    assert (p.version, p.previous, p.state) == ("2", None, "probation")
    assert any("previous 1 failed verification" in line and "dropped it" in line for line in s.recovery)
    assert not (root / "ops/rmsnorm/1").exists()


def test_open_with_rollback_unconfirmed_keeps_a_confirmed_version(tmp_path):
    root = tmp_path / "s"
    s = _versions_1_and_2(root)
    s.confirm("rmsnorm")
    s = open_store(root, rollback_unconfirmed=True)
    assert (s.pointer("rmsnorm").version, s.recovery) == ("2", [])


def test_open_removes_slots_no_pointer_names(tmp_path):
    root = tmp_path / "s"
    _versions_1_and_2(root)
    shutil.copytree(root / "ops/rmsnorm/1", root / "ops/rmsnorm/0")  # a slot no pointer names
    s = open_store(root)
    assert not (root / "ops/rmsnorm/0").exists()
    assert any("removed slot 0, which no pointer names" in line for line in s.recovery)


def test_a_received_stream_is_read_in_1_mib_chunks(store):
    class Recording(io.BytesIO):
        sizes: list = []

        def read(self, n=-1):
            self.sizes.append(n)
            return super().read(n)

    stream = Recording(fakepkg.pack(AUTHOR, version=2))
    store.install(stream)
    assert set(stream.sizes) == {1 << 20}


def test_pointer_files_are_sorted_indented_json_a_person_can_read_on_the_device():
    p = plugin_store.Pointer(op="rmsnorm", version="2", previous="1", changed_at="2026-12-01T00:00:00+00:00")
    assert p.to_bytes() == (
        b'{\n  "base": "bundle",\n  "blocked": [],\n  "changed_at": "2026-12-01T00:00:00+00:00",\n  "clean_stop": false,\n'
        b'  "floor": null,\n  "format": 1,\n  "history": [],\n  "note": "",\n  "op": "rmsnorm",\n  "previous": "1",\n'
        b'  "probation_requests": 0,\n  "state": "confirmed",\n  "version": "2"\n}\n'
    )  # no probation_served while it is 0: a runtime from before the field reads the file
    during = p.model_copy(update={"state": "probation", "probation_requests": 3, "probation_served": 5})
    assert b'"probation_served": 5' in during.to_bytes()
    assert plugin_store.Pointer.model_validate_json(during.to_bytes()) == during


def test_slot_records_are_indented_json(store):
    store.install(fakepkg.pack(AUTHOR, version=2))
    text = (store.root / "ops/rmsnorm/2/slot.json").read_text()
    assert text.startswith('{\n  "format": 1,\n  "op": "rmsnorm",\n  "version": "2",')
