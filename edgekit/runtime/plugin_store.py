"""The on-device plugin store: crash-safe install, switch, probation and rollback.

Layout under the store root::

    .lock                          flock'd by every mutation (server and agent may share a store)
    .owner.lock                    flock'd for its whole life by the one runtime (serve) that owns the store:
                                   taken before start-up recovery, so a second server touches nothing
    tmp/                           received packages (receive step); emptied at start-up
    ops/<op>/active                pointer: {"version", "previous", "history", "base", "state", "blocked", ...}
    ops/<op>/<version>/            one slot per kept version: the plugin's files,
                                   package.bin (the signed bytes) and slot.json (written last)
    ops/<op>/<version>.staging/    a slot being written; removed at start-up

A swap is a sequence of explicit steps; only the pointer rename makes a new
version active, and only ``open()`` decides what survives a crash::

    received -> verified -> golden_checked -> staging_partial -> staging_written
             -> staged -> pointer_temp_written -> switched -> cleaned

After a kill at any step, ``open()`` deletes temp and staging leftovers and
slots no pointer names, then re-verifies the active slot from its signed
package; if that fails it falls back to the previous version, else to the torch
reference. So the device always comes back on exactly one consistent, verified
version per operator.

Versions below the active one: ``previous``, then ``history`` (older first, at most
``KEPT_VERSIONS`` slots in all), then the *base*: the bundle's own plugin when the
store was opened with ``bundle_plugins`` naming one for the operator, else the
torch reference. A rollback steps down one rung at a time: newest store version ->
older store versions -> the bundle's own -> the reference. The store never holds
the bundle's files (the bundle is verified on its own); it lists them as installed
versions so a device reports everything that serves.

Verification and the golden-vector check are injected callables (the trust logic
lives in ``edgekit.bundle.plugin``; this module only moves bytes and pointers).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgekit.errors import BundleError, EdgekitError
from edgekit import durable
from edgekit.runtime.plugin_policy import (
    DevicePolicy,
    OpState,
    SwapRefused,
    REASONS,
    VerifiedPluginLike,
    admit,
    check_compatible,
    canonical_version,
    check_name,
    version_key,
    version_number,
)

INSTALL_STEPS = (
    "received",
    "verified",
    "golden_checked",
    "staging_partial",
    "staging_written",
    "staged",
    "pointer_temp_written",
    "switched",
    "cleaned",
)
# Rollback and confirm are one pointer write each.
POINTER_STEPS = ("pointer_temp_written", "switched")

POINTER_FILE = "active"
SLOT_RECORD = "slot.json"
PACKAGE_FILE = "package.bin"
STAGING_SUFFIX = ".staging"
FORMAT_VERSION = 1
KEPT_VERSIONS = 4  # slots kept per operator (active + previous + history): the rungs a rollback can step down
LOCK_TIMEOUT_S = 30.0

Verifier = Callable[[bytes], VerifiedPluginLike]
GoldenCheck = Callable[[VerifiedPluginLike], None]
# Called as checkpoint("install", step) after each step; crash tests kill the process there.
Checkpoint = Callable[[str, str], None]


class StoreError(BundleError):
    """The store directory itself is unusable (permissions, busy lock, bad layout)."""


class UnknownOperatorError(StoreError):
    """An operator name that neither the registry, the store nor the bundle knows (a typo, or another model's)."""


class StoreBusyError(StoreError):
    """Another process held the store's lock for longer than LOCK_TIMEOUT_S: retry later."""


class StoreInUseError(StoreError):
    """Another runtime (an `edgekit serve`) owns this store: a second one must not recover or serve it."""


OWNER_LOCK = ".owner.lock"


class StoreOwner:
    """The exclusive, crash-safe claim of one runtime on a store: an flock held for the runtime's life.

    Recovery with ``rollback_unconfirmed`` rolls back whatever is on probation, which is right after a crash and
    wrong while another server still serves it: so it runs only under this claim. The kernel drops an flock when
    its holder dies (kill -9 included), so a crash never leaves the store claimed."""

    def __init__(self, root: Path, fd: int):
        self.root, self._fd = root, fd

    @classmethod
    def claim(cls, root: str | os.PathLike) -> "StoreOwner":
        """Claim the store at ``root`` (created if needed) or raise StoreInUseError at once, changing nothing."""
        root = Path(root)
        try:
            root.mkdir(parents=True, exist_ok=True)
            fd = os.open(root / OWNER_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise StoreError(f"cannot open the plugin store at {root}: {e}", hint="pass a writable --store directory") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreInUseError(f"plugin store {root} is in use by another edgekit serve (pid {holder}); it was not "
                                  "touched", hint="stop that server first, or pass another --store") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # for the message a second server prints
        return cls(root, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def default_known_abi() -> dict[str, int]:
    """operator -> ABI version of this runtime, from the operator registry."""
    from edgekit.kernels.registry import OPERATORS

    return {name: op.spec.abi_version for name, op in OPERATORS.items()}


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _loose_files_problem(slot: Path, expected: Mapping[str, str]) -> str | None:
    """Why the slot's loose files (all but its record and package) are not exactly ``expected`` (name -> sha256 of
    the signed package's file), or None."""
    present = {e.name for e in slot.iterdir()} - {SLOT_RECORD, PACKAGE_FILE}
    if present != set(expected):
        return f"slot files differ from the package (extra/missing: {sorted(present ^ set(expected))})"
    for name, digest in expected.items():
        if _sha256((slot / name).read_bytes()) != digest:
            return f"{name} does not match the signed package"
    return None


class Pointer(BaseModel):
    """ops/<op>/active. ``version`` None means the base serves the operator: the bundle's own plugin
    (``base == "bundle"`` and the bundle ships one), else the torch reference."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal[1] = 1
    op: str
    version: str | None
    previous: str | None = None
    history: tuple[str, ...] = ()  # store versions older than previous, oldest first
    base: Literal["bundle", "reference"] = "bundle"  # what serves once no store version is left
    state: Literal["confirmed", "probation"] = "confirmed"
    blocked: tuple[str, ...] = ()
    changed_at: str = Field(default_factory=_now)
    note: str = ""
    floor: str | None = None  # the newest version ever installed; survives rollbacks (downgrade check)
    probation_requests: int = 0  # requests that called the version on probation so far (survives restarts)
    probation_served: int = 0  # requests served while it was on probation, calling it or not (survives restarts)
    clean_stop: bool = False  # the runtime stopped cleanly while this version was on probation

    def op_state(self) -> OpState:
        return OpState(active=self.version, previous=self.previous, blocked=self.blocked, floor=self.floor)

    def to_json(self) -> dict[str, Any]:
        """The pointer as commands and the server print it: every version a number (``version_number``), as the
        signed plugin.json has it. The file itself (``to_bytes``) keeps the store's canonical strings, which older
        runtimes read."""
        return versions_as_numbers(self.model_dump())

    def to_bytes(self) -> bytes:
        # probation_served is written only while it counts something: a runtime from before the field (its Pointer
        # forbids unknown keys) still reads every other pointer, as it read them before
        skip = {"probation_served"} if self.probation_served == 0 else None
        return (json.dumps(self.model_dump(exclude=skip), indent=2, sort_keys=True) + "\n").encode()


class SlotRecord(BaseModel):
    """ops/<op>/<version>/slot.json: what the slot must contain, written last before the rename."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal[1] = 1
    op: str
    version: str
    target_arch: str
    abi_version: int
    package_sha256: str
    package_bytes: int
    files: dict[str, str]  # name -> sha256
    installed_at: str = Field(default_factory=_now)


@dataclass(frozen=True)
class ActivePlugin:
    op: str
    version: str
    state: str
    previous: str | None
    slot_dir: Path
    files: dict[str, Path]


@dataclass
class SwapResult:
    op: str
    version: str
    previous: str | None
    state: str
    step_ms: dict[str, float]  # measured on this machine, wall clock per step

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "version": version_number(self.version),
            "previous": version_number(self.previous),
            "state": self.state,
            "step_ms": {k: round(v, 3) for k, v in self.step_ms.items()},
        }


@dataclass(frozen=True)
class Event:
    kind: str  # "installed", "refused", "confirmed", "rolled_back", "recovered"
    op: str | None
    detail: str
    at: str = field(default_factory=_now)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "op": self.op, "detail": self.detail, "at": self.at}


class PluginStore:
    """Operator plugins on disk. Create with ``PluginStore.open(...)``, which recovers first."""

    def __init__(
        self,
        root: Path,
        *,
        policy: DevicePolicy,
        verify: Verifier,
        golden_check: GoldenCheck | None,
        checkpoint: Checkpoint | None,
        bundle_plugins: Mapping[str, Any] | None = None,
    ):
        self.root = root
        # op -> version of the plugin the bundle itself ships (the base below every store version)
        self.bundle_plugins = {op: canonical_version(v) for op, v in (bundle_plugins or {}).items()}
        self.policy = policy
        self._verify_fn = verify
        self._golden_check = golden_check
        self._checkpoint = checkpoint
        self.events: list[Event] = []
        self.recovery: list[str] = []  # what open() repaired, one line each
        self.owner: StoreOwner | None = None  # the runtime's claim (open with rollback_unconfirmed)

    @property
    def golden_check(self) -> GoldenCheck | None:
        """The check every install runs (read-only: an install's answer says what it ran)."""
        return self._golden_check

    # -- construction and recovery --------------------------------------------
    @classmethod
    def open(
        cls,
        root: str | os.PathLike,
        *,
        policy: DevicePolicy,
        verify: Verifier,
        golden_check: GoldenCheck | None = None,
        checkpoint: Checkpoint | None = None,
        rollback_unconfirmed: bool = False,
        bundle_plugins: Mapping[str, Any] | None = None,
        owner: StoreOwner | None = None,
        refuse_policy_drops: bool = False,
    ) -> "PluginStore":
        """Open (creating if needed) and recover the store at `root`.

        ``refuse_policy_drops``: where a slot whose files are the bytes its record lists is refused (by this opener's
        trust, arch or edgekit version), or a pointer is JSON this edgekit cannot read, raise StoreError before
        anything is touched instead of dropping, blocking and deleting (``_refuse_policy_drops``). The
        serving runtime starts without it: a device revokes a signer or leaves an arch that way. The store and
        agent commands pass it, so a mistyped ``--trust`` or ``--target`` cannot delete what the device serves.

        ``bundle_plugins``: op -> version of the plugins the served bundle ships; listed as
        installed versions and used as the last rung before the reference on rollback.

        ``rollback_unconfirmed``: a version still on probation at start-up is rolled
        back (boot-count style: a restart before confirmation counts against it). Only the store's owner
        may do that: ``owner`` (claimed earlier, e.g. before a long model load), else claimed here; a store
        another runtime owns raises StoreInUseError before anything is touched. ``close()`` releases it.
        """
        root = Path(root)
        if rollback_unconfirmed and owner is None:
            owner = StoreOwner.claim(root)
        store = cls(root, policy=policy, verify=verify, golden_check=golden_check, checkpoint=checkpoint,
                    bundle_plugins=bundle_plugins)
        store.owner = owner
        try:
            try:
                (root / "tmp").mkdir(parents=True, exist_ok=True)
                (root / "ops").mkdir(exist_ok=True)
            except OSError as e:
                raise StoreError(f"cannot create the plugin store at {root}: {e}",
                                 hint="pass a writable --store directory") from e
            with store._locked():
                if refuse_policy_drops:
                    store._refuse_policy_drops()
                store._recover(rollback_unconfirmed)
        except BaseException:
            store.close()
            raise
        return store

    def close(self) -> None:
        """Release the runtime's claim on the store (if it holds one); the store object stays readable."""
        if self.owner is not None:
            self.owner.release()

    def _refuse_policy_drops(self) -> None:
        """StoreError, before recovery touches anything, naming what recovery would drop although nothing on disk is
        damaged: a version a pointer serves or rolls back to whose files are the bytes its record lists but which this
        opener refuses (its --trust, --target or edgekit version), and a pointer this edgekit cannot read although it
        is JSON (another edgekit version wrote it)."""
        refused = []
        for op_dir in sorted((self.root / "ops").iterdir()):
            if not op_dir.is_dir() or durable.is_temp_name(op_dir.name):
                continue
            op = op_dir.name
            pointer, problem = self._read_pointer(op)
            if problem:
                if self._pointer_of_another_edgekit(op):
                    refused.append(f"{op}: its pointer is one this edgekit cannot read ({problem})")
                continue
            for version in dict.fromkeys((pointer.version, pointer.previous, *pointer.history)):
                bad = self._slot_problem(op, version) if version is not None else None
                if bad and self._slot_bytes_intact(op, version):
                    refused.append(f"{op} {version}: {bad}")
        if refused:
            raise StoreError(
                f"the store at {self.root} holds plugins that this command refuses although their files are intact: "
                f"{'; '.join(refused)}. Nothing was changed",
                hint="pass the --trust key(s) and --target the plugins were installed with, and run the edgekit "
                     "version that serves this store. To revoke a signer or leave an arch on purpose, restart "
                     "`edgekit serve` on this store with the new --trust / target: its start-up drops them (the "
                     "active version is blocked, older kept versions are deleted); until then this command refuses")

    def _recover(self, rollback_unconfirmed: bool) -> None:
        for leftover in sorted((self.root / "tmp").iterdir()):
            durable.remove_leftover(leftover)
            self.recovery.append(f"removed received leftover tmp/{leftover.name}")
        for op_dir in sorted((self.root / "ops").iterdir()):
            if durable.is_temp_name(op_dir.name):
                durable.remove_leftover(op_dir)
                continue
            if not op_dir.is_dir():
                continue
            self._recover_op(op_dir, rollback_unconfirmed)
        for line in self.recovery:
            self.events.append(Event("recovered", None, line))

    def _recover_op(self, op_dir: Path, rollback_unconfirmed: bool) -> None:
        op = op_dir.name
        for entry in sorted(op_dir.iterdir()):
            if entry.name.endswith(STAGING_SUFFIX) or durable.is_temp_name(entry.name):
                durable.remove_leftover(entry)
                self.recovery.append(f"{op}: removed interrupted {entry.name}")
        pointer, problem = self._read_pointer(op)
        if problem:
            self.recovery.append(f"{op}: pointer unreadable ({problem}); serving the reference")
            pointer = Pointer(op=op, version=None, note=f"recovered: {problem}")
            self._write_pointer(pointer)
        assert pointer is not None
        original = pointer

        if pointer.version is not None:
            bad = self._slot_problem(op, pointer.version)
            if bad:
                prev_bad = self._slot_problem(op, pointer.previous) if pointer.previous else "no previous version"
                fallback = pointer.previous if not prev_bad else None
                self.recovery.append(
                    f"{op}: active {pointer.version} failed verification ({bad}); "
                    + (f"fell back to previous {fallback}" if fallback else f"serving the reference ({prev_bad})")
                )
                pointer = Pointer(
                    op=op, version=fallback, previous=pointer.history[-1] if fallback and pointer.history else None,
                    history=pointer.history[:-1] if fallback else (), base=pointer.base,
                    blocked=_add(pointer.blocked, pointer.version), note=f"recovered: {pointer.version} failed verification",
                    floor=_newest(pointer.floor, pointer.version),
                )
        if pointer.previous is not None:
            bad = self._slot_problem(op, pointer.previous)
            if bad:
                self.recovery.append(f"{op}: previous {pointer.previous} failed verification ({bad}); dropped it")
                pointer = pointer.model_copy(update={"previous": None})
        for old in pointer.history:
            bad = self._slot_problem(op, old)
            if bad:
                self.recovery.append(f"{op}: older version {old} failed verification ({bad}); dropped it")
                pointer = pointer.model_copy(update={"history": tuple(v for v in pointer.history if v != old)})
        if rollback_unconfirmed and pointer.state == "probation":
            if pointer.clean_stop:
                # a clean stop (SIGTERM, upgrade) says nothing against the plugin: probation resumes
                self.recovery.append(f"{op}: {pointer.version} resumes probation after {pointer.probation_requests} "
                                     "request(s) (the runtime had stopped cleanly)")
                pointer = pointer.model_copy(update={"clean_stop": False})
            else:
                self.recovery.append(f"{op}: {pointer.version} was on probation when the runtime died; rolled back")
                pointer = _rolled_back(pointer, "the runtime died during probation")
        if pointer != original:
            self._write_pointer(pointer)
        for name in self._orphan_slots(op_dir, pointer):
            durable.remove_tree_atomically(op_dir / name)
            self.recovery.append(f"{op}: removed slot {name}, which no pointer names")

    # -- reading ---------------------------------------------------------------
    def ops(self) -> list[str]:
        """Operators with a pointer in the store (the bundle's other plugins are listed by ``status``)."""
        return sorted(p.name for p in (self.root / "ops").iterdir() if p.is_dir() and not durable.is_temp_name(p.name))

    def serving(self, p: Pointer) -> tuple[str | None, str]:
        """(version, source) of what serves under pointer `p`: source is "store", "bundle" or "reference"."""
        return serving_of(p, self.bundle_plugins)

    def pointer(self, op: str) -> Pointer:
        """The operator's pointer; an operator never touched is on the reference."""
        pointer, problem = self._read_pointer(check_name("operator", op))
        if problem:
            raise StoreError(f"pointer of {op} is unreadable ({problem})", hint="restart the runtime so recovery repairs it")
        return pointer

    def active(self, op: str) -> ActivePlugin | None:
        """Where the active version's files are, or None when the reference serves `op`."""
        p = self.pointer(op)
        if p.version is None:
            return None
        slot = self._slot_dir(op, p.version)
        record = SlotRecord.model_validate_json((slot / SLOT_RECORD).read_bytes())
        return ActivePlugin(op, p.version, p.state, p.previous, slot, {n: slot / n for n in record.files})

    def load(self, op: str, version: str | None = None) -> VerifiedPluginLike | None:
        """Re-verify a slot from its signed package and return the verified plugin (None = reference).

        Loaders should launch from these verified bytes, not re-read loose files.
        """
        version = self.pointer(op).version if version is None else canonical_version(version)
        if version is None:
            return None
        plugin, problem = self._check_slot(op, version)
        if problem:
            raise StoreError(f"slot {op}/{version} failed verification: {problem}", hint="restart the runtime to recover")
        return plugin

    def status(self) -> list[dict[str, Any]]:
        """One row per operator of the store or the bundle: what serves (``version``, ``source``) and the
        rungs a rollback steps down (``previous``, ``history``, then the bundle's ``bundle_version``)."""
        rows = []
        for op in sorted(set(self.ops()) | set(self.bundle_plugins)):
            p = self.pointer(op)
            version, source = self.serving(p)
            rows.append(versions_as_numbers(
                {"op": op, "version": version, "source": source, "previous": p.previous, "history": list(p.history),
                 "bundle_version": self.bundle_plugins.get(op), "state": p.state, "blocked": list(p.blocked),
                 "changed_at": p.changed_at}
            ))
        return rows

    # -- the swap --------------------------------------------------------------
    def install(
        self,
        package: bytes | BinaryIO | str | os.PathLike,
        *,
        allow_downgrade: bool = False,
        allow_blocked: bool = False,
        expect: Mapping[str, Any] | None = None,
        golden_check: GoldenCheck | None = None,
    ) -> SwapResult:
        """Receive, verify, golden-check, stage and switch to a plugin package; it starts on probation.

        Raises SwapRefused (with a ``reason`` code) and leaves the store unchanged when refused.
        """
        step_ms: dict[str, float] = {}
        clock = [time.perf_counter()]

        def step(name: str) -> None:
            now = time.perf_counter()
            step_ms[name] = (now - clock[0]) * 1e3
            clock[0] = now
            self._step("install", name)

        with self._locked():
            received: Path | None = None
            slot_made: Path | None = None
            op: str | None = None
            try:
                received = self._receive(package)
                step("received")
                data = received.read_bytes()
                plugin = self._verify(data)
                op = check_name("operator", plugin.op)
                current = self._current_pointer(op)
                version = admit(
                    plugin, self.policy, self._admission_state(current),
                    allow_downgrade=allow_downgrade, allow_blocked=allow_blocked, expect=expect,
                )
                step("verified")
                self._run_golden(plugin, golden_check or self._golden_check)
                step("golden_checked")
                slot_made = self._stage(op, version, plugin, data, step)
                history = current.history + ((current.previous,) if current.previous else ())
                new = Pointer(
                    op=op, version=version, previous=current.version, history=history[max(0, len(history) - (KEPT_VERSIONS - 2)):],
                    base=current.base, state="probation", blocked=current.blocked, floor=_newest(current.floor, version),
                )
                self._write_pointer(new, between=lambda: step("pointer_temp_written"))
                slot_made = None  # the pointer names it now
                step("switched")
                self._collect_quietly(op, new)
                step("cleaned")
            except SwapRefused as e:
                self.events.append(Event("refused", op, str(e)))
                raise
            finally:
                if received is not None:
                    received.unlink(missing_ok=True)
                if slot_made is not None and slot_made.exists():  # staged but never switched to
                    durable.remove_tree_atomically(slot_made)
        self.events.append(Event("installed", op, f"{version} on probation (previous {current.version or 'reference'})"))
        return SwapResult(op, version, current.version, "probation", step_ms)

    def _known_operator(self, op: str) -> str:
        """``op`` if an operator of the registry, the store or the bundle; StoreError naming them otherwise (a typo
        must not read as "nothing to do")."""
        from edgekit.kernels.registry import OPERATORS

        check_name("operator", op)
        known = set(OPERATORS) | set(self.ops()) | set(self.bundle_plugins)
        if op not in known:
            raise UnknownOperatorError(f"unknown operator {op!r}; expected one of: {', '.join(sorted(known))}",
                             hint="`edgekit store status` lists the operators and what serves each")
        return op

    def confirm(self, op: str) -> Pointer:
        """End probation: the active version becomes confirmed (the previous one is still kept)."""
        with self._locked():
            p = self._current_pointer(self._known_operator(op))
            if p.state != "probation":
                return p
            new = p.model_copy(update={"state": "confirmed", "changed_at": _now(), "note": "confirmed",
                                       "probation_served": 0})
            self._write_pointer(new, between=lambda: self._step("confirm", "pointer_temp_written"))
            self._step("confirm", "switched")
        self.events.append(Event("confirmed", op, f"{new.version} confirmed"))
        return new

    def record_probation(self, op: str, version: str, requests: int, *, served: int | None = None,
                         clean_stop: bool = False) -> Pointer:
        """Persist how far `version` of `op` got on probation: ``requests`` that called it, ``served`` in all (None:
        as recorded), and whether the runtime is stopping cleanly, so a restart resumes its probation instead of
        rolling a healthy plugin back."""
        with self._locked():
            p = self._current_pointer(check_name("operator", op))
            if p.state != "probation" or p.version != version:
                return p  # confirmed or rolled back meanwhile: nothing to record
            new = p.model_copy(update={"probation_requests": requests, "clean_stop": clean_stop,
                                       "probation_served": p.probation_served if served is None else served})
            if new != p:
                self._write_pointer(new)
        return new

    def rollback(self, op: str, reason: str = "manual rollback", *, block: bool = True) -> Pointer:
        """Step one rung down in one atomic write: the previous store version, an older one, the bundle's
        own plugin, then the reference.

        A rolled-back store version is blocked so an agent does not re-install it (``block``; a probation that
        failed on latency alone passes False: the plugin did nothing wrong that a quieter device would not
        forgive); its slot is deleted either way.
        """
        with self._locked():
            p = self._current_pointer(self._known_operator(op))
            _, source = self.serving(p)
            if source == "reference":
                raise StoreError(f"{op} already runs on the reference; there is nothing to roll back")
            new = _rolled_back(p, reason, block=block)
            self._write_pointer(new, between=lambda: self._step("rollback", "pointer_temp_written"))
            self._step("rollback", "switched")
            self._collect_quietly(op, new)
        self.events.append(Event("rolled_back", op, f"{_label(self.serving(p))} -> {_label(self.serving(new))}: {reason}"))
        return new

    # -- steps -----------------------------------------------------------------
    def _step(self, action: str, name: str) -> None:
        if self._checkpoint is not None:
            self._checkpoint(action, name)

    def _receive(self, package: bytes | BinaryIO | str | os.PathLike) -> Path:
        """Copy the package into tmp/, refusing more than max_package_bytes without buffering it all."""
        limit = self.policy.max_package_bytes
        dest = durable.temp_name(self.root / "tmp" / "received")
        if isinstance(package, (bytes, bytearray, memoryview)):
            if len(package) > limit:
                raise SwapRefused("oversized", f"package is {len(package)} bytes; the store accepts at most {limit}")
            dest.write_bytes(bytes(package))
            return dest
        close = False
        if isinstance(package, (str, os.PathLike)):
            try:
                package, close = open(package, "rb"), True
            except OSError as e:
                raise StoreError(f"cannot read plugin package {package}: {e}") from e
        try:
            total = 0
            with open(dest, "wb") as out:
                while chunk := package.read(1 << 20):
                    total += len(chunk)
                    if total > limit:
                        break
                    out.write(chunk)
            if total > limit:
                dest.unlink(missing_ok=True)
                raise SwapRefused("oversized", f"package is more than {limit} bytes, the most the store accepts")
            return dest
        finally:
            if close:
                package.close()

    def _verify(self, data: bytes) -> VerifiedPluginLike:
        """The injected verifier, with whatever it raises turned into a SwapRefused reason."""
        try:
            return self._verify_fn(data)
        except SwapRefused:
            raise
        except EdgekitError as e:
            raise SwapRefused(_reason_for(e), e.message, hint=e.hint) from e
        except Exception as e:  # untrusted bytes: any failure to parse them is a refusal, never an install
            raise SwapRefused("corrupted", f"the verifier could not read the package ({type(e).__name__}: {e})") from e

    def _run_golden(self, plugin: VerifiedPluginLike, check: GoldenCheck | None) -> None:
        if check is None:
            return
        try:
            check(plugin)
        except SwapRefused:
            raise
        except Exception as e:  # a check that cannot run has not shown the numbers are right
            raise SwapRefused(
                "golden_mismatch", f"{plugin.op} {plugin.version}: {e}", hint="fix the kernel and publish a new version"
            ) from e

    def _stage(self, op: str, version: str, plugin: VerifiedPluginLike, data: bytes, step: Callable[[str], None]) -> Path:
        op_dir = self.root / "ops" / op
        if not op_dir.exists():
            op_dir.mkdir()
            durable.fsync_dir(op_dir.parent)
        staging = op_dir / f"{version}{STAGING_SUFFIX}"
        final = op_dir / version
        if staging.exists():
            durable.remove_leftover(staging)
        if final.exists():  # an unreferenced slot from an install that failed after staging
            durable.remove_tree_atomically(final)
        staging.mkdir()
        try:
            files = dict(plugin.files)
            for i, (name, blob) in enumerate(sorted(files.items())):
                durable.write_new_file(staging / name, blob)
                if i == 0:
                    step("staging_partial")
            durable.write_new_file(staging / PACKAGE_FILE, data)
            record = SlotRecord(
                op=op, version=version, target_arch=str(plugin.target_arch), abi_version=int(plugin.abi_version),
                package_sha256=_sha256(data), package_bytes=len(data), files={n: _sha256(b) for n, b in files.items()},
            )
            # slot.json last: a directory without it is visibly incomplete.
            durable.write_new_file(staging / SLOT_RECORD, record.model_dump_json(indent=2).encode())
            durable.fsync_dir(staging)
            step("staging_written")
        except BaseException:
            durable.remove_leftover(staging)  # e.g. disk full: leave nothing behind
            raise
        os.rename(staging, final)
        durable.fsync_dir(op_dir)
        step("staged")
        return final

    def _collect_quietly(self, op: str, pointer: Pointer) -> None:
        """After a switch the swap has happened; failing to delete an old slot must not report it as failed."""
        try:
            self._collect(op, pointer)
        except OSError as e:
            self.events.append(Event("cleanup_failed", op, f"old slots stay until the next start-up: {e}"))

    def _collect(self, op: str, pointer: Pointer) -> None:
        """Delete slots the pointer no longer names (kept: active, previous and history)."""
        op_dir = self.root / "ops" / op
        for name in self._orphan_slots(op_dir, pointer):
            durable.remove_tree_atomically(op_dir / name)

    # -- slots and pointers ------------------------------------------------------
    def _admission_state(self, p: Pointer) -> OpState:
        """The pointer's admission state with the bundle's own plugin counted: it is the active version while no
        store version serves, and its version is a floor (a store plugin of the bundle's version or older would
        silently replace the bundle's own, which was verified with the bundle)."""
        state = p.op_state()
        bundle = self.bundle_plugins.get(p.op)
        if bundle is None:
            return state
        active = state.active if state.active is not None or p.base != "bundle" else bundle
        return replace(state, active=active, floor=_newest(state.floor, bundle))

    def _slot_dir(self, op: str, version: str) -> Path:
        return self.root / "ops" / op / canonical_version(version)

    def _orphan_slots(self, op_dir: Path, pointer: Pointer) -> list[str]:
        keep = {pointer.version, pointer.previous, *pointer.history}
        return sorted(
            e.name for e in op_dir.iterdir()
            if e.is_dir() and e.name not in keep and not durable.is_temp_name(e.name)
        )

    def _read_pointer(self, op: str) -> tuple[Pointer | None, str | None]:
        path = self.root / "ops" / op / POINTER_FILE
        if not path.exists():
            return Pointer(op=op, version=None), None
        try:
            p = Pointer.model_validate_json(path.read_bytes())
        except (ValidationError, OSError, UnicodeDecodeError) as e:
            return None, f"{type(e).__name__}: {str(e).splitlines()[0]}"
        if p.op != op:
            return None, f"pointer names operator {p.op!r} but lives under {op!r}"
        return p, None

    def _current_pointer(self, op: str) -> Pointer:
        p, problem = self._read_pointer(op)
        if problem:
            raise StoreError(f"pointer of {op} is unreadable ({problem})", hint="restart the runtime so recovery repairs it")
        return p

    def _write_pointer(self, pointer: Pointer, between: Callable[[], None] | None = None) -> None:
        op_dir = self.root / "ops" / pointer.op
        if not op_dir.exists():
            op_dir.mkdir()
            durable.fsync_dir(op_dir.parent)
        durable.replace_atomically(op_dir / POINTER_FILE, pointer.to_bytes(), between=between)

    def _slot_problem(self, op: str, version: str | None) -> str | None:
        if version is None:
            return "no version"
        return self._check_slot(op, version)[1]

    def _slot_bytes_intact(self, op: str, version: str) -> bool:
        """Whether the slot's files are the bytes its record lists (package.bin and every loose file, by sha256, and
        no other file): such a slot was verified when it was installed, so a refusal now comes from the opener (its
        trust, arch or edgekit version), not from damage on disk."""
        slot = self._slot_dir(op, version)
        try:
            record = SlotRecord.model_validate_json((slot / SLOT_RECORD).read_bytes())
            if _sha256((slot / PACKAGE_FILE).read_bytes()) != record.package_sha256:
                return False
            return _loose_files_problem(slot, record.files) is None
        except (OSError, ValidationError):
            return False

    def _pointer_of_another_edgekit(self, op: str) -> bool:
        """Whether the op's pointer is a JSON object that this edgekit's Pointer model refuses (another version wrote
        it), as opposed to damaged bytes."""
        try:
            return isinstance(json.loads((self.root / "ops" / op / POINTER_FILE).read_bytes()), dict)
        except (OSError, ValueError):
            return False

    def _check_slot(self, op: str, version: str) -> tuple[VerifiedPluginLike | None, str | None]:
        """Re-verify a slot: signed package still verifies, record and loose files match it exactly."""
        slot = self._slot_dir(op, version)
        if not slot.is_dir():
            return None, "slot directory missing"
        try:
            record = SlotRecord.model_validate_json((slot / SLOT_RECORD).read_bytes())
            data = (slot / PACKAGE_FILE).read_bytes()
        except (OSError, ValidationError) as e:
            return None, f"slot record or package unreadable ({type(e).__name__})"
        if _sha256(data) != record.package_sha256:
            return None, "package.bin does not match its recorded sha256"
        try:
            plugin = self._verify(data)
            _, admitted_version = check_compatible(plugin, self.policy)
        except SwapRefused as e:
            return None, f"package no longer verifies or no longer fits this runtime ({e.reason})"
        if plugin.op != op or admitted_version != version or record.op != op or record.version != version:
            return None, f"slot holds {plugin.op} {admitted_version}, not {op} {version}"
        expected = {n: _sha256(b) for n, b in plugin.files.items()}
        if record.files != expected:
            return None, "slot record lists other files than the signed package"
        problem = _loose_files_problem(slot, expected)
        return (None, problem) if problem else (plugin, None)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One mutator at a time across processes (a server and an agent may share a store).

        flock is released by the kernel when the holder dies, so a kill -9 never wedges the store.
        """
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + LOCK_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise StoreBusyError(
                            f"plugin store {self.root} stayed locked for {LOCK_TIMEOUT_S:.0f} s",
                            hint="another edgekit process (server or agent) is installing; retry later",
                        ) from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # closing releases the flock


_VERSION_FIELDS = ("version", "previous", "history", "blocked", "floor", "bundle_version")


def versions_as_numbers(row: Mapping[str, Any]) -> dict[str, Any]:
    """A pointer or status row as JSON writes it: its version fields (``_VERSION_FIELDS``) numbers, lists of numbers
    for ``history`` and ``blocked`` (``version_number``), as a signed plugin.json stores a version; the rest as is."""
    return {k: ([version_number(x) for x in v] if isinstance(v, (list, tuple)) else version_number(v))
            if k in _VERSION_FIELDS else v for k, v in row.items()}


def serving_of(p: Pointer, bundle_plugins: Mapping[str, str]) -> tuple[str | None, str]:
    """(version, source) of what serves under pointer `p`, given the bundle's op -> version."""
    if p.version is not None:
        return p.version, "store"
    if p.base == "bundle" and p.op in bundle_plugins:
        return bundle_plugins[p.op], "bundle"
    return None, "reference"


def _add(items: tuple[str, ...], version: str | None) -> tuple[str, ...]:
    if version is None or version in items:
        return items
    return items + (version,)


def _newest(a: str | None, b: str | None) -> str | None:
    return max((v for v in (a, b) if v is not None), key=version_key, default=None)


def _rolled_back(p: Pointer, reason: str, *, block: bool = True) -> Pointer:
    """One rung down. From a store version: the previous one (older ones move up); from the base
    (no store version left): the bundle's own plugin gives way to the reference. ``block``: the rolled-back
    version may not be installed again."""
    if p.version is None:
        return p.model_copy(update={"base": "reference", "state": "confirmed", "changed_at": _now(),
                                    "note": f"rolled back the bundle's own plugin: {reason}"})
    return Pointer(
        op=p.op, version=p.previous, previous=p.history[-1] if p.history else None, history=p.history[:-1],
        base=p.base, state="confirmed", blocked=_add(p.blocked, p.version) if block else p.blocked,
        note=f"rolled back {p.version}: {reason}", floor=_newest(p.floor, p.version),
    )


def _label(serving: tuple[str | None, str]) -> str:
    version, source = serving
    return "reference" if source == "reference" else f"{version} ({source})"


def _reason_for(e: EdgekitError) -> str:
    """Map a verifier's error to a refusal code by what it says (verifiers own their wording)."""
    code = getattr(e, "reason_code", None)
    if code in REASONS:
        return code
    text = str(e).lower()
    if "not trusted" in text or "untrusted" in text:
        return "untrusted_key"
    if "signature" in text:
        return "bad_signature"
    if "schema" in text or "plugin.json" in text:
        return "schema"
    if "hash" in text or "sha256" in text or "tar" in text or "corrupt" in text or "truncated" in text:
        return "corrupted"
    return "verification_failed"
