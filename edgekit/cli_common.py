"""Shared CLI plumbing: one console, one error boundary, JSON output."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

from edgekit.units import fmt_bytes  # noqa: F401  (re-exported for the commands)

# Piped or redirected output is read by people and scripts in full: rich would cut it to 80 columns
# (or to an inherited COLUMNS) and shorten cells ("attentio…"), so off a terminal lines and tables
# take the width they need.
UNBOUNDED_WIDTH = 100_000


def _console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr) if stream.isatty() else Console(stderr=stderr, width=UNBOUNDED_WIDTH)


console = _console()
err_console = _console(stderr=True)


def print_json(data: Any) -> None:
    """Machine-readable output on stdout (nothing else is printed there when --json is given)."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def note(text: str) -> None:
    """A non-fatal remark for the user (deprecations, fallbacks) on stderr, never on stdout."""
    err_console.print(f"[yellow]note:[/] {text}", highlight=False, soft_wrap=True)


def cli_precision(value: str, allowed) -> str:
    """--precision in the one vocabulary (edgekit.precision_names); old spellings print a note."""
    from edgekit.precision_names import parse_precision

    return parse_precision(value, allowed, warn=note)


def head_embedding_line(he: dict) -> str:
    """One line of report.json's ``head_embedding`` (edgekit.quant.stored_bytes) for build, quantize and info."""
    return (f"LM head: {he['lm_head']}; embedding: {he['embedding']}; weight bytes per decoded token "
            f"{fmt_bytes(he['bytes_per_token'])} = {he['vs_fp16']:.3f} x FP16's {fmt_bytes(he['fp16_bytes_per_token'])} "
            f"(computed from the stored weights)")
