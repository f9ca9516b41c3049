"""The plugin store's swap path: install, refusals that change nothing, probation, rollback, recovery."""

from __future__ import annotations

import io
import json

import pytest
from runtime_helpers import tree_digest

import fakepkg
from edgekit.runtime.plugin_policy import SwapRefused
from edgekit.runtime.plugin_store import INSTALL_STEPS, KEPT_VERSIONS, PluginStore, StoreError

AUTHOR = fakepkg.key_from_seed(1)
STRANGER = fakepkg.key_from_seed(2)


def open_store(root, **kw):
    kw.setdefault("policy", fakepkg.policy())
    kw.setdefault("verify", fakepkg.verifier(AUTHOR))
    kw.setdefault("golden_check", fakepkg.golden_check)
    return PluginStore.open(root, **kw)


@pytest.fixture
def store(tmp_path):
    return open_store(tmp_path / "store")


def test_first_install_goes_active_on_probation_with_reference_as_previous(store):
    result = store.install(fakepkg.pack(AUTHOR, version=2))
    assert (result.op, result.version, result.previous, result.state) == ("rmsnorm", "2", None, "probation")
    assert list(result.step_ms) == list(INSTALL_STEPS)
    active = store.active("rmsnorm")
    assert active.version == "2" and active.state == "probation"
    assert active.files["kernel.txt"].read_bytes() == b"scale=2.0\n"
    assert store.load("rmsnorm").version == 2


def test_upgrade_keeps_the_last_versions_and_collects_older_slots(store):
    for v in range(1, KEPT_VERSIONS + 3):
        store.install(fakepkg.pack(AUTHOR, version=v))
    newest = KEPT_VERSIONS + 2
    p = store.pointer("rmsnorm")
    assert (p.version, p.previous) == (str(newest), str(newest - 1))
    assert p.history == tuple(str(v) for v in range(newest - KEPT_VERSIONS + 1, newest - 1))
    slots = sorted((d.name for d in (store.root / "ops" / "rmsnorm").iterdir() if d.is_dir()), key=int)
    assert slots == [str(v) for v in range(newest - KEPT_VERSIONS + 1, newest + 1)]


def test_rollback_walks_back_through_versions_then_the_bundle_then_the_reference(tmp_path):
    store = open_store(tmp_path / "store", bundle_plugins={"rmsnorm": 1, "swiglu": 1})
    for v in (2, 3, 4):
        store.install(fakepkg.pack(AUTHOR, version=v))
    walked = []
    while True:
        row = next(r for r in store.status() if r["op"] == "rmsnorm")
        walked.append((row["version"], row["source"]))
        if row["source"] == "reference":
            break
        store.rollback("rmsnorm", "test")
    assert walked == [(4, "store"), (3, "store"), (2, "store"), (1, "bundle"), (None, "reference")]
    assert store.active("rmsnorm") is None and store.pointer("rmsnorm").blocked == ("4", "3", "2")
    with pytest.raises(StoreError, match="nothing to roll back"):
        store.rollback("rmsnorm")
    # the untouched operator still lists the bundle's own plugin, and a reopened store keeps the rung it is on
    reopened = open_store(tmp_path / "store", bundle_plugins={"rmsnorm": 1, "swiglu": 1})
    rows = {r["op"]: (r["version"], r["source"]) for r in reopened.status()}
    assert rows == {"rmsnorm": (None, "reference"), "swiglu": (1, "bundle")}


def test_status_lists_the_bundles_plugins_before_any_swap(tmp_path):
    store = open_store(tmp_path / "store", bundle_plugins={"rmsnorm": 1, "attention_decode": 2})
    rows = store.status()
    assert [(r["op"], r["version"], r["source"], r["bundle_version"]) for r in rows] == [
        ("attention_decode", 2, "bundle", 2), ("rmsnorm", 1, "bundle", 1)]
    store.install(fakepkg.pack(AUTHOR, version=2))
    row = next(r for r in store.status() if r["op"] == "rmsnorm")
    assert (row["version"], row["source"], row["previous"], row["bundle_version"]) == (2, "store", None, 1)
    # the first rollback after the first swap goes to the bundle's own version, not the reference
    store.rollback("rmsnorm")
    row = next(r for r in store.status() if r["op"] == "rmsnorm")
    assert (row["version"], row["source"]) == (1, "bundle")


def test_dotted_versions_compare_numerically(store):
    store.install(fakepkg.pack(AUTHOR, version="1.9.0"))
    store.install(fakepkg.pack(AUTHOR, version="1.10.0"))
    assert store.pointer("rmsnorm").version == "1.10.0"


def test_confirm_ends_probation(store):
    store.install(fakepkg.pack(AUTHOR, version=2))
    assert store.confirm("rmsnorm").state == "confirmed"
    assert store.pointer("rmsnorm").state == "confirmed"


@pytest.mark.parametrize("action", ["confirm", "rollback"])
def test_an_unknown_operator_is_refused_naming_the_known_ones(store, action):
    from edgekit.runtime.plugin_store import StoreError

    store.install(fakepkg.pack(AUTHOR, version=2))
    with pytest.raises(StoreError, match="unknown operator 'nosuch'; expected one of: .*rmsnorm"):
        getattr(store, action)("nosuch")
    assert store.ops() == ["rmsnorm"] and store.pointer("rmsnorm").state == "probation"  # nothing written


def test_rollback_flips_to_previous_blocks_the_bad_version_and_deletes_its_slot(store):
    store.install(fakepkg.pack(AUTHOR, version=1))
    store.confirm("rmsnorm")
    store.install(fakepkg.pack(AUTHOR, version=2))
    p = store.rollback("rmsnorm", "latency regression")
    assert (p.version, p.previous, p.state, p.blocked) == ("1", None, "confirmed", ("2",))
    assert not (store.root / "ops" / "rmsnorm" / "2").exists()
    assert store.load("rmsnorm").version == 1
    with pytest.raises(SwapRefused) as e:  # an agent must not re-install what the watchdog rolled back
        store.install(fakepkg.pack(AUTHOR, version=2))
    assert e.value.reason == "blocked"
    store.install(fakepkg.pack(AUTHOR, version=3))  # a fixed, newer version is fine


def test_rollback_of_first_plugin_returns_to_reference(store):
    store.install(fakepkg.pack(AUTHOR, version=1))
    assert store.rollback("rmsnorm").version is None
    assert store.active("rmsnorm") is None
    with pytest.raises(StoreError, match="nothing to roll back"):
        store.rollback("rmsnorm")


def test_allow_downgrade_installs_an_older_version(store):
    store.install(fakepkg.pack(AUTHOR, version=5))
    store.install(fakepkg.pack(AUTHOR, version=3), allow_downgrade=True)
    assert (store.pointer("rmsnorm").version, store.pointer("rmsnorm").previous) == ("3", "5")


def test_streamed_package_is_received_in_chunks(store):
    store.install(io.BytesIO(fakepkg.pack(AUTHOR, version=2)))
    assert store.pointer("rmsnorm").version == "2"


# -- every refusal names its reason and changes nothing ---------------------------

def _refusals():
    good = fakepkg.pack(AUTHOR, version=3)
    # attack: bump the version inside the signed body without re-signing
    tampered = good.replace(b'"version":3', b'"version":4')
    assert tampered != good
    return {
        "bad_signature": (tampered, {}),
        "untrusted_key": (fakepkg.pack(STRANGER, version=3), {}),
        "wrong_arch": (fakepkg.pack(AUTHOR, version=3, arch="sm_90"), {}),
        "unknown_abi": (fakepkg.pack(AUTHOR, version=3, abi=2), {}),
        "unknown_op": (fakepkg.pack(AUTHOR, op="conv2d", version=3), {}),
        "triton_abi": (fakepkg.pack(AUTHOR, version=3, triton_abi="2"), {}),
        "downgrade": (fakepkg.pack(AUTHOR, version=1), {}),
        "already_installed": (fakepkg.pack(AUTHOR, version=1), {"allow_downgrade": True}),
        # a kernel that is subtly wrong: 0.05% off on every element
        "golden_mismatch": (fakepkg.pack(AUTHOR, version=3, scale=2.001), {}),
        "corrupted": (good[: len(good) // 2][:5], {}),
        "oversized": (fakepkg.pack(AUTHOR, version=3, extra_files={"pad.bin": b"\0" * (1 << 20)}), {}),
        "schema": (fakepkg.pack(AUTHOR, version=3, extra_files={"slot.json": b"{}"}), {}),
        "metadata_mismatch": (good, {"expect": {"op": "rmsnorm", "version": "4"}}),
    }


@pytest.mark.parametrize("reason", sorted(_refusals()))
def test_refusal_names_the_reason_and_changes_nothing(store, reason):
    store.install(fakepkg.pack(AUTHOR, version=1))
    store.install(fakepkg.pack(AUTHOR, version=2))
    before = tree_digest(store.root)
    package, kwargs = _refusals()[reason]
    with pytest.raises(SwapRefused) as e:
        store.install(package, **kwargs)
    assert e.value.reason == reason, str(e.value)
    assert tree_digest(store.root) == before
    assert store.events[-1].kind == "refused"


def test_oversized_stream_is_cut_off_without_reading_it_all(tmp_path):
    store = open_store(tmp_path / "s", policy=fakepkg.policy(max_package_bytes=4096))
    stream = io.BytesIO(b"x" * (10 << 20))
    with pytest.raises(SwapRefused) as e:
        store.install(stream)
    assert e.value.reason == "oversized"
    assert stream.tell() < (3 << 20)  # stopped after the chunk that crossed the limit
    assert list((store.root / "tmp").iterdir()) == []


def test_a_golden_check_that_crashes_refuses_the_plugin(store):
    def broken(plugin):
        raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS")

    with pytest.raises(SwapRefused) as e:
        store.install(fakepkg.pack(AUTHOR, version=2), golden_check=broken)
    assert e.value.reason == "golden_mismatch" and "ILLEGAL_ADDRESS" in str(e.value)
    assert store.active("rmsnorm") is None


# -- start-up recovery -------------------------------------------------------------

def _two_versions(root):
    s = open_store(root)
    s.install(fakepkg.pack(AUTHOR, version=1))
    s.confirm("rmsnorm")
    s.install(fakepkg.pack(AUTHOR, version=2))
    return s


def test_open_falls_back_to_previous_when_active_file_is_corrupted(tmp_path):
    root = tmp_path / "s"
    _two_versions(root)
    (root / "ops/rmsnorm/2/kernel.txt").write_bytes(b"scale=2.5\n")  # bit rot / tampering on disk
    s = open_store(root)
    p = s.pointer("rmsnorm")
    assert (p.version, p.previous, p.blocked) == ("1", None, ("2",))
    assert any("active 2 failed verification" in line for line in s.recovery)
    assert not (root / "ops/rmsnorm/2").exists()


def test_open_falls_back_to_reference_when_both_slots_are_bad(tmp_path):
    root = tmp_path / "s"
    _two_versions(root)
    (root / "ops/rmsnorm/2/package.bin").write_bytes(b"garbage")
    (root / "ops/rmsnorm/1/golden.json").unlink()
    s = open_store(root)
    assert s.pointer("rmsnorm").version is None and s.active("rmsnorm") is None
    assert [d for d in (root / "ops/rmsnorm").iterdir() if d.is_dir()] == []


def test_open_refuses_slots_once_their_signer_is_no_longer_trusted(tmp_path):
    root = tmp_path / "s"
    _two_versions(root)
    s = open_store(root, verify=fakepkg.verifier(STRANGER))  # key rotation: AUTHOR revoked
    assert s.pointer("rmsnorm").version is None


def test_open_rebuilds_an_unreadable_pointer_as_reference(tmp_path):
    root = tmp_path / "s"
    _two_versions(root)
    (root / "ops/rmsnorm/active").write_bytes(b'{"version": ')
    s = open_store(root)
    assert s.pointer("rmsnorm").version is None
    assert json.loads((root / "ops/rmsnorm/active").read_bytes())["version"] is None


def test_open_with_rollback_unconfirmed_rolls_back_a_version_on_probation(tmp_path):
    root = tmp_path / "s"
    _two_versions(root)
    s = open_store(root, rollback_unconfirmed=True)
    p = s.pointer("rmsnorm")
    assert (p.version, p.blocked) == ("1", ("2",))


def test_open_keeps_a_consistent_store_untouched(tmp_path):
    root = tmp_path / "s"
    _two_versions(root)
    before = tree_digest(root)
    s = open_store(root)
    assert s.recovery == [] and tree_digest(root) == before


def test_concurrent_installs_are_serialized_by_the_store_lock(tmp_path):
    import threading
    import time

    root = tmp_path / "s"
    inside = threading.Event()

    def slow(action, step):  # hold the lock for a while in the middle of a swap
        if step == "golden_checked":
            inside.set()
            time.sleep(0.5)

    a = open_store(root, checkpoint=slow)
    b = open_store(root)
    results = {}
    ta = threading.Thread(target=lambda: results.setdefault("a", a.install(fakepkg.pack(AUTHOR, version=1))))
    ta.start()
    inside.wait(5)
    t0 = time.monotonic()
    results["b"] = b.install(fakepkg.pack(AUTHOR, version=2))
    waited = time.monotonic() - t0
    ta.join(5)
    assert waited > 0.1  # b could not start its swap while a was in the middle of one
    p = b.pointer("rmsnorm")
    assert (p.version, p.previous) == ("2", "1")
