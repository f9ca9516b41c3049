"""Shared CLI plumbing: one console, one error boundary, JSON output."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

from edgekit.units import fmt_bytes  # noqa: F401  (re-exported for the commands)

console = Console()
err_console = Console(stderr=True)


def print_json(data: Any) -> None:
    """Machine-readable output on stdout (nothing else is printed there when --json is given)."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
