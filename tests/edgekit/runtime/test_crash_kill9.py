"""Kill -9 at every step of a swap, restart, and demand exactly one consistent, verified version.

Each case runs the action in a child process that SIGKILLs itself right after
the named step (no Python cleanup runs), then reopens the store here. Because a
SIGKILL keeps the page cache, what survives is decided by whether the pointer
rename happened: before it the old version must be active, after it the new one.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

import fakepkg
from edgekit import durable
from edgekit.runtime.plugin_store import INSTALL_STEPS, POINTER_STEPS, PluginStore

HERE = Path(__file__).resolve().parent
AUTHOR = fakepkg.key_from_seed(1)


def open_store(root):
    return PluginStore.open(root, policy=fakepkg.policy(), verify=fakepkg.verifier(AUTHOR), golden_check=fakepkg.golden_check)


def crash(root: Path, action: str, step: str, version: int = 0, fmt: str = "fake") -> None:
    proc = subprocess.run(
        [sys.executable, str(HERE / "crash_swap.py"), str(root), action, step, str(version), fmt],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, f"child did not die at {action}/{step}: rc={proc.returncode}\n{proc.stderr}"


def assert_one_consistent_version(root: Path, expected: str | None, expected_previous: str | None, opener=None) -> PluginStore:
    store = (opener or open_store)(root)
    p = store.pointer("rmsnorm")
    assert (p.version, p.previous) == (expected, expected_previous), store.recovery
    if expected is not None:
        plugin = store.load("rmsnorm")  # re-verifies the signed package and every loose file
        assert str(plugin.version) == expected
    # nothing half-done is left: no received temp files, no staging dirs, no temp pointers,
    # and exactly the slots the pointer names (active, previous and the older versions a rollback can reach)
    assert list((root / "tmp").iterdir()) == []
    op_dir = root / "ops" / "rmsnorm"
    entries = {e.name for e in op_dir.iterdir()} if op_dir.exists() else set()
    assert not any(n.endswith(".staging") or durable.is_temp_name(n) for n in entries), entries
    assert entries - {"active"} == {v for v in (expected, expected_previous, *p.history) if v is not None}
    return store


SWITCHED = INSTALL_STEPS.index("switched")


@pytest.mark.parametrize("step", INSTALL_STEPS)
def test_kill_during_first_install(tmp_path, step):
    root = tmp_path / "store"
    open_store(root)
    crash(root, "install", step, version=1)
    after = INSTALL_STEPS.index(step) >= SWITCHED
    store = assert_one_consistent_version(root, "1" if after else None, None)
    store.install(fakepkg.pack(AUTHOR, version=5))  # the store is usable after recovery


@pytest.mark.parametrize("step", INSTALL_STEPS)
def test_kill_during_upgrade(tmp_path, step):
    root = tmp_path / "store"
    s = open_store(root)
    s.install(fakepkg.pack(AUTHOR, version=1))
    s.confirm("rmsnorm")
    s.install(fakepkg.pack(AUTHOR, version=2))
    crash(root, "install", step, version=3)
    if INSTALL_STEPS.index(step) >= SWITCHED:
        store = assert_one_consistent_version(root, "3", "2")
        assert store.pointer("rmsnorm").state == "probation" and store.pointer("rmsnorm").history == ("1",)
    else:
        store = assert_one_consistent_version(root, "2", "1")
    store.install(fakepkg.pack(AUTHOR, version=9))


@pytest.mark.parametrize("step", POINTER_STEPS)
def test_kill_during_rollback(tmp_path, step):
    root = tmp_path / "store"
    s = open_store(root)
    s.install(fakepkg.pack(AUTHOR, version=1))
    s.install(fakepkg.pack(AUTHOR, version=2))
    crash(root, "rollback", step)
    if step == "switched":
        store = assert_one_consistent_version(root, "1", None)
        assert store.pointer("rmsnorm").blocked == ("2",)
    else:
        assert_one_consistent_version(root, "2", "1")


@pytest.mark.parametrize("step", POINTER_STEPS)
def test_kill_during_confirm(tmp_path, step):
    root = tmp_path / "store"
    s = open_store(root)
    s.install(fakepkg.pack(AUTHOR, version=1))
    crash(root, "confirm", step)
    store = assert_one_consistent_version(root, "1", None)
    assert store.pointer("rmsnorm").state == ("confirmed" if step == "switched" else "probation")


def test_leftovers_of_a_crash_are_removed_and_the_pointer_kept(tmp_path):
    root = tmp_path / "store"
    s = open_store(root)
    s.install(fakepkg.pack(AUTHOR, version=1))
    op_dir = root / "ops" / "rmsnorm"
    (root / "tmp" / ".received.0badc0de.tmp").write_bytes(b"FAKEPKG1\nhalf a pack")
    (op_dir / ".active.deadbeef.tmp").write_bytes(b'{"format": 1, "op": "rmsn')  # torn pointer temp
    (op_dir / "4.staging").mkdir()
    (op_dir / "4.staging" / "kernel.txt").write_bytes(b"scale=")
    (op_dir / "7").mkdir()  # a complete-looking slot that no pointer names
    (op_dir / "7" / "slot.json").write_bytes(b"{}")
    store = assert_one_consistent_version(root, "1", None)
    assert len(store.recovery) == 4, store.recovery


@pytest.mark.parametrize("step", ["staging_partial", "pointer_temp_written", "switched"])
def test_kill_during_upgrade_with_real_signed_packages(tmp_path, step):
    import realpkg

    open_real = realpkg.open_store

    root = tmp_path / "store"
    s = open_real(root)
    s.install(realpkg.pack(realpkg.key(1), 1))
    crash(root, "install", step, version=2, fmt="real")
    switched = INSTALL_STEPS.index(step) >= SWITCHED
    store = assert_one_consistent_version(root, "2" if switched else "1", "1" if switched else None, opener=open_real)
    assert store.load("rmsnorm").files["kernel.cubin"].endswith(b"v2" if switched else b"v1")
