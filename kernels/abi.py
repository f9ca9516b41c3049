"""The Triton kernel ABI facts the launcher relies on, by Triton version.

After its user arguments a compiled Triton kernel takes hidden pointer
parameters: Triton 3.4 one (global scratch), 3.5 and 3.6 two (global scratch,
profile scratch). A plugin built with a Triton whose ABI is not listed here is
refused rather than launched with a guessed argument list.
"""

from __future__ import annotations

from edgekit.errors import BundleError

HIDDEN_ARGS_BY_TRITON = {(3, 4): 1, (3, 5): 2, (3, 6): 2}


class UnknownKernelABIError(BundleError):
    """A compiled kernel comes from a Triton version whose launch ABI edgekit does not know."""


def triton_minor(version: str) -> tuple[int, int]:
    try:
        major, minor = version.split(".")[:2]
        return int(major), int(minor)
    except (ValueError, AttributeError) as e:
        raise UnknownKernelABIError(f"cannot read Triton version {version!r}; expected 'MAJOR.MINOR[.PATCH]'") from e


def hidden_args_for(version: str) -> int:
    key = triton_minor(version)
    if key not in HIDDEN_ARGS_BY_TRITON:
        known = ", ".join(f"{a}.{b}" for a, b in sorted(HIDDEN_ARGS_BY_TRITON))
        raise UnknownKernelABIError(
            f"kernel built with Triton {version}, whose launch ABI this edgekit does not know (known: {known})",
            hint="rebuild the plugin with a supported Triton, or upgrade edgekit on the device")
    return HIDDEN_ARGS_BY_TRITON[key]
