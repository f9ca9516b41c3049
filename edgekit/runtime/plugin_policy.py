"""Whether a verified plugin may replace the active one: pure rules, no I/O.

The store (``plugin_store.py``) receives bytes, asks an injected verifier for a
``VerifiedPluginLike`` (signature, schema and hashes are the verifier's job),
and then asks this module for a verdict: is the plugin for this device's
architecture, for an operator ABI this runtime speaks, built by a Triton whose
kernel ABI the launcher understands, and newer than what is active? Every
refusal carries a stable ``reason`` code (for JSON, HTTP answers and tests)
and a message saying what was received, what was expected and how to fix it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping

from edgekit.bundle.plugin import MAX_PACKAGE_BYTES
from edgekit.bundle.plugin_identity import (  # noqa: F401  (the device's checks speak the same identity rules)
    CUSTOM_KEY,
    REASONS,
    SwapRefused,
    VerifiedPluginLike,
    canonical_version,
    check_name,
    normalize_arch,
    parse_version,
    version_key,
    version_number,
)

RESERVED_FILE_NAMES = frozenset({"slot.json", "package.bin"})
_FILE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")


def check_file_name(name: Any) -> str:
    """Slot files are flat: one safe component, never a path, never a store-owned name."""
    if not isinstance(name, str) or not _FILE_RE.fullmatch(name) or name in RESERVED_FILE_NAMES:
        raise SwapRefused(
            "schema",
            f"file name {name!r} in the package is not a plain file name ([A-Za-z0-9_.-], no '/', not {sorted(RESERVED_FILE_NAMES)})",
        )
    return name


@dataclass(frozen=True)
class DevicePolicy:
    """What this device accepts. ``known_abi``: operator -> ABI version the runtime speaks."""

    device_arch: str
    known_abi: Mapping[str, int]
    # Triton kernel-ABI tags the launcher understands (e.g. {"3"} for Triton 3.x);
    # None means the verifier does not report one and the check is skipped.
    triton_abis: Collection[str] | None = None
    max_package_bytes: int = MAX_PACKAGE_BYTES  # the package format's own cap (bundle.plugin)


@dataclass(frozen=True)
class OpState:
    """The admission-relevant part of an operator's pointer."""

    active: str | None = None  # canonical version, None = torch reference
    previous: str | None = None
    blocked: tuple[str, ...] = field(default_factory=tuple)
    floor: str | None = None  # the highest version ever installed: rollbacks do not lower it


def check_compatible(plugin: VerifiedPluginLike, policy: DevicePolicy) -> tuple[str, str]:
    """(op, canonical version) if this device can run the plugin at all; SwapRefused otherwise.

    Checked at install and again at every start-up (an edgekit upgrade may change an ABI).
    """
    op = check_name("operator", plugin.op)
    version = canonical_version(plugin.version)
    arch = normalize_arch(plugin.target_arch)
    for name in plugin.files:
        check_file_name(name)
    device_arch = normalize_arch(policy.device_arch)
    if arch != device_arch:
        raise SwapRefused(
            "wrong_arch",
            f"{op} {version} was compiled for {arch}; this device is {device_arch}",
            hint=f"build the plugin for {device_arch}",
        )
    if op not in policy.known_abi:
        raise SwapRefused(
            "unknown_op", f"operator {op!r} is not one of this runtime's: {', '.join(sorted(policy.known_abi))}"
        )
    abi = plugin.abi_version
    if isinstance(abi, bool) or not isinstance(abi, int) or abi != policy.known_abi[op]:
        raise SwapRefused(
            "unknown_abi",
            f"{op} {version} speaks operator ABI {abi!r}; this runtime speaks ABI {policy.known_abi[op]} for {op}",
            hint="rebuild the plugin against this edgekit version",
        )
    triton_abi = getattr(plugin, "triton_abi", None)
    if policy.triton_abis is not None and triton_abi is not None and str(triton_abi) not in policy.triton_abis:
        raise SwapRefused(
            "triton_abi",
            f"{op} {version} was compiled with Triton kernel ABI {triton_abi!r}; the launcher supports {sorted(policy.triton_abis)}",
            hint="rebuild the plugin with a supported Triton version",
        )
    return op, version


SAME_VERSION_HINT = ("it is the version running now: nothing to install; to replace it, pack the new kernels with a "
                     "higher --version")


def admit(
    plugin: VerifiedPluginLike,
    policy: DevicePolicy,
    state: OpState,
    *,
    allow_downgrade: bool = False,
    allow_blocked: bool = False,
    expect: Mapping[str, Any] | None = None,
) -> str:
    """Return the plugin's canonical version if it may be staged; raise SwapRefused otherwise.

    ``expect`` holds what an update channel announced (op, version, target_arch):
    the package itself must agree, so metadata cannot smuggle a different plugin in.
    """
    if expect is not None:
        check_announced(plugin, expect)
    op, version = check_compatible(plugin, policy)
    if version in state.blocked and not allow_blocked:
        raise SwapRefused(
            "blocked",
            f"{op} {version} was rolled back on this device before",
            hint="publish a fixed plugin with a higher version",
        )
    if state.active is not None and version_key(version) <= version_key(state.active) and not allow_downgrade:
        raise SwapRefused(
            "downgrade",
            f"{op} {version} is not newer than the active version {state.active}",
            # the active version again: --allow-downgrade only led on to 'already the active version'
            hint=SAME_VERSION_HINT if version_key(version) == version_key(state.active)
            else "pass allow_downgrade (--allow-downgrade) to install an older version on purpose",
        )
    if state.floor is not None and version_key(version) < version_key(state.floor) and not allow_downgrade:
        # after a rollback (even to the reference) an older signed package must not slip back in
        raise SwapRefused(
            "downgrade",
            f"{op} {version} is older than {state.floor}, the newest version this device has installed",
            hint="pass allow_downgrade (--allow-downgrade) to install an older version on purpose",
        )
    if version in (state.active, state.previous):
        which = "active" if version == state.active else "previous"
        raise SwapRefused(
            "already_installed",
            f"{op} {version} is already the {which} version",
            hint="use rollback to return to the previous version" if which == "previous" else None,
        )
    return version


def check_announced(plugin: VerifiedPluginLike, expect: Mapping[str, Any]) -> None:
    """The package must be what the update metadata said it is."""
    actual = {
        "op": check_name("operator", plugin.op),
        "version": canonical_version(plugin.version),
        "target_arch": normalize_arch(plugin.target_arch),
    }
    normalize = {"op": str, "version": canonical_version, "target_arch": normalize_arch}
    for key, value in expect.items():
        if key not in actual or value is None:
            continue
        announced = normalize[key](value)
        if announced != actual[key]:
            raise SwapRefused(
                "metadata_mismatch",
                f"update metadata announced {key}={announced!r} but the package says {key}={actual[key]!r}",
                hint="republish the plugin so its metadata is generated from the package",
            )
