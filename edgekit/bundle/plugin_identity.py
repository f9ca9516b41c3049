"""A plugin's identity as the publisher writes it and the device reads it: names, versions, architectures.

Pure rules shared by both sides of an over-the-air swap: the host publisher
(``edgekit.publish``) spells versions and architectures with them, and the
device (``edgekit.runtime.plugin_policy``, the TUF agent) checks what it
receives with the same functions. Every refusal is a ``SwapRefused`` with a
stable ``reason`` code (for JSON, HTTP answers and tests) and a message saying
what was received, what was expected and how to fix it.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Protocol, runtime_checkable

from edgekit.errors import BundleError

# Stable refusal codes. The HTTP server and the agent report these verbatim.
REASONS = {
    "oversized": "the package is larger than the store accepts",
    "corrupted": "the package bytes are damaged or not a plugin package",
    "bad_signature": "the signature does not match the package bytes",
    "untrusted_key": "the package is signed by a key this device does not trust",
    "schema": "plugin.json does not follow the plugin schema",
    "wrong_arch": "the plugin was compiled for another GPU architecture",
    "unknown_op": "the plugin is for an operator this runtime does not have",
    "unknown_abi": "the plugin speaks an operator ABI version this runtime does not",
    "triton_abi": "the plugin was compiled by a Triton whose kernel ABI the launcher does not support",
    "downgrade": "the plugin is not newer than the active version",
    "already_installed": "this version already has a slot on the device",
    "blocked": "this version was rolled back on this device before",
    "metadata_mismatch": "the package does not match the update metadata that announced it",
    "golden_mismatch": "the plugin's outputs do not match its golden vectors",
    "load_failed": "the runtime could not load or launch the plugin; it was rolled back",
    "verification_failed": "the package failed verification",
}

# Versions are a non-negative integer or dotted integers ("3", "1.4.2"); the
# canonical string doubles as the slot directory name, so it must stay this narrow.
# These patterns are applied with .fullmatch: with .match, `$` also accepts a final "\n".
_VERSION_RE = re.compile(r"^(0|[1-9][0-9]{0,8})(\.(0|[1-9][0-9]{0,8})){0,3}$")
MAX_VERSION_PART = 999_999_999  # nine digits, as _VERSION_RE admits: `plugin pack --version` is held to it too
# Operator and architecture names also become path components.
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_]{0,63}$")
_ARCH_RE = re.compile(r"^sm_[0-9]{2,3}[a-z]?$")


class SwapRefused(BundleError):
    """A plugin package was refused; nothing on the device changed.

    ``reason`` is one of ``REASONS`` (stable, for scripts); the message is for people.
    """

    def __init__(self, reason: str, message: str, *, hint: str | None = None):
        assert reason in REASONS, reason
        self.reason = reason
        super().__init__(f"plugin refused ({reason}): {message}", hint=hint)


@runtime_checkable
class VerifiedPluginLike(Protocol):
    """What the store needs from a verified plugin package (edgekit.bundle.plugin provides one).

    ``files`` maps a plain file name (no directories) to its verified bytes.
    """

    op: str
    version: Any  # int or dotted-int string; see parse_version
    target_arch: str
    abi_version: int
    files: Mapping[str, bytes]


def parse_version(value: Any) -> tuple[int, ...]:
    """A version as a comparable tuple: 3 -> (3,), "1.4.2" -> (1, 4, 2).

    Comparison pads with zeros, so "2" == "2.0" (they would collide as slots anyway).
    """
    text = canonical_version(value)
    return tuple(int(p) for p in text.split("."))


def canonical_version(value: Any) -> str:
    """The one spelling of a version, also used as its slot directory name."""
    if isinstance(value, bool):
        raise SwapRefused("schema", f"version {value!r} is a boolean; expected an integer or a dotted version like '1.2.0'")
    if isinstance(value, int):
        text = str(value)
    elif isinstance(value, str):
        text = value.strip()
    else:
        raise SwapRefused("schema", f"version {value!r} has type {type(value).__name__}; expected an int or a string like '1.2.0'")
    if not _VERSION_RE.fullmatch(text):
        raise SwapRefused(
            "schema", f"version {value!r} is not a non-negative integer or dotted integers (e.g. 3 or '1.2.0'), "
                      f"each at most {MAX_VERSION_PART}"
        )
    return text


def version_number(value: Any) -> int | str | None:
    """A plugin version as edgekit writes it in JSON (CLI output, HTTP answers, logs, update metadata): a number, as
    the signed plugin.json stores it (3, not "3"); None (nothing installed) stays None.

    The store's rules also admit dotted versions ("1.4.2"), which no signed plugin can carry (plugin.json's version
    is an integer >= 1); such a version is written as its canonical string, since it is no number."""
    if value is None:
        return None
    text = canonical_version(value)
    return int(text) if "." not in text else text


def version_key(value: Any) -> tuple[int, ...]:
    parts = parse_version(value)
    return parts + (0,) * (4 - len(parts))


def normalize_arch(value: Any) -> str:
    """'sm_87', 'sm87', '87', 87, 'cuda:87' -> 'sm_87' (what a plugin was compiled for)."""
    text = str(value).strip().lower()
    for prefix in ("cuda:", "sm_", "sm"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    candidate = f"sm_{text}"
    if not _ARCH_RE.fullmatch(candidate):
        raise SwapRefused("schema", f"target architecture {value!r} is not a CUDA SM name; expected e.g. 'sm_87' or 'sm_90'")
    return candidate


def check_name(kind: str, value: Any) -> str:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise SwapRefused("schema", f"{kind} {value!r} is not a lower-case identifier ([a-z0-9_], at most 64 characters)")
    return value


# The key of edgekit's fields in a TUF target's "custom" metadata (written by edgekit.publish, read by the agent).
CUSTOM_KEY = "edgekit"
