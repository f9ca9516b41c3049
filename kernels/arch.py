"""CUDA architectures: the ones edgekit compiles for, and how an arch is written.

An arch is its compute capability as one number (87 = Jetson Orin, 90 = H100/H200):
the signed manifest, plugin.json and the compiler take the number. Target profiles,
JSON reports and messages write it as a name, "sm_87"; ``arch_name`` and
``arch_number`` are the only two places that spelling is made or read.
"""

from __future__ import annotations

# Archs the Triton bundled with edgekit compiles for (ptxas 12.8); a new one is one line here.
SUPPORTED_ARCHS = (80, 86, 87, 89, 90)

_PREFIX = "sm_"


def arch_of_capability(major: int, minor: int) -> int:
    """A compute capability (torch's ``get_device_capability``, cudaDeviceProp) as one arch number: (8, 7) -> 87."""
    return 10 * int(major) + int(minor)


def arch_name(arch: int) -> str:
    """87 -> "sm_87": the arch as target profiles, JSON and messages write it."""
    return f"{_PREFIX}{arch}"


def arch_number(name: str) -> int:
    """"sm_87" -> 87, the inverse of ``arch_name``. Raises ValueError for anything else."""
    digits = name[len(_PREFIX):] if name.startswith(_PREFIX) else ""
    if not (digits.isascii() and digits.isdigit()):  # int() alone would take " 87" and "+87"
        raise ValueError(f"{name!r} is not an arch name; expected e.g. {arch_name(87)!r}")
    return int(digits)


# The names a target profile's gpu.arch may take: the supported archs, spelled.
SUPPORTED_ARCH_NAMES = tuple(arch_name(a) for a in SUPPORTED_ARCHS)
