"""The one precision vocabulary of every command, help text and report.

``fp16``   FP16 weights and activations (FP32 accumulation).
``int8``   W8A16: weight-only INT8 (per-channel scales), FP16 activations. The default of `plan` and `build`.
``w8a8``   INT8 weights and per-token INT8 activations (SmoothQuant), INT32 accumulation.
``int4``   W4A16: group-wise INT4 weights (kernels/int4_layout.py), FP16 activations. A GGUF whose
           projections are 4-bit (Q4_0, Q4_1, Q4_K) is taken in losslessly (group 32).

Older spellings are accepted with a deprecation note on stderr (``w8a16`` -> ``int8``).
"""

from __future__ import annotations

from typing import Callable, Iterable

from edgekit.errors import ConfigError
from edgekit.kernels.weight_schemes import CLI_SCHEMES

PRECISIONS = {name: s.description for name, s in CLI_SCHEMES.items()}  # kernels/weight_schemes.py's records
NOT_IMPLEMENTED: frozenset[str] = frozenset()  # a name reserved in the vocabulary before its code exists
DEPRECATED_ALIASES = {"w8a16": "int8"}
DEFAULT_PRECISION = "int8"
# What `build` accepts, and so `plan` too: a plan is what a build executes (`build --plan`), so the two take one list
BUILD_PRECISIONS = ("int8", "w8a8", "fp16", "int4")
# The quantizer's own name for each precision it produces (edgekit.quant: mode "w8a16" | "w8a8" | "w4a16"): the
# scheme's name
QUANT_MODE = {name: s.name for name, s in CLI_SCHEMES.items() if s.quantized}


def name_of_quant_mode(mode: str) -> str:
    """The quantizer's mode ("w8a16") as the vocabulary's name ("int8")."""
    return {m: p for p, m in QUANT_MODE.items()}.get(mode, mode)


def _ignore(note: str) -> None:
    return None


def help_text(allowed: Iterable[str], default: str | None = DEFAULT_PRECISION) -> str:
    """One help sentence naming each accepted precision; used by every --precision option."""
    names = [n for n in allowed]
    parts = [f"{n} ({PRECISIONS[n]}{', reserved: not implemented yet' if n in NOT_IMPLEMENTED else ''})" for n in names]
    tail = f" Default: {default}." if default else ""
    return "; ".join(parts) + "." + tail


def parse_precision(value: str, allowed: Iterable[str], *, option: str = "--precision",
                    warn: Callable[[str], None] = _ignore) -> str:
    """The canonical name of `value`, or a ConfigError naming what is accepted here.

    An old spelling is accepted; ``warn`` receives the deprecation note (the CLI prints it on stderr)."""
    allowed = tuple(allowed)
    name = value.strip().lower()
    if name in DEPRECATED_ALIASES:
        new = DEPRECATED_ALIASES[name]
        warn(f"{option} {name} is the old name of {new}; use {new}")
        name = new
    if name in NOT_IMPLEMENTED:
        raise ConfigError(
            f"{option} {name} ({PRECISIONS[name]}) is not implemented yet",
            hint=f"use one of: {', '.join(n for n in allowed if n not in NOT_IMPLEMENTED)}",
        )
    if name not in allowed:
        known = f" ({PRECISIONS[name]})" if name in PRECISIONS else ""
        raise ConfigError(f"{option} {value!r}{known} is not accepted here",
                          hint=f"expected one of: {', '.join(n for n in allowed if n not in NOT_IMPLEMENTED)}")
    return name


HEAD_PRECISIONS = ("int8", "int4")


def head_scheme(head_precision: str | None, precision: str) -> str | None:
    """--head-precision (int8 | int4, or None: the blocks') as the quantizer's head scheme, checked against the
    model's --precision: an INT4 model's head may be INT8 or INT4, an INT8 (or W8A8) model's head is its own."""
    if head_precision is None:
        return None
    allowed = HEAD_PRECISIONS if precision == "int4" else (precision,) if precision in ("int8", "w8a8") else ()
    if head_precision not in allowed:
        raise ConfigError(f"--head-precision {head_precision} with --precision {precision}: expected "
                          + (f"one of {', '.join(allowed)}" if allowed else "no --head-precision (nothing is quantized)"),
                          hint="--head-precision int8 keeps an INT4 model's LM head (and tied embedding) at INT8")
    return QUANT_MODE[head_precision]
