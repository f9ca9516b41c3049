"""The Jetson power mode (nvpmodel), for reports and benchmark rows.

``nvpmodel -q`` prints the active mode's name and id, e.g. (JetPack 6)::

    NV Power Mode: MAXN_SUPER
    2

(JetPack 5 prints the same two lines; some releases add a warning line before
them, which is skipped.) The tool is found on ``PATH`` -- tests put a fake one
there -- and run without a shell, with a timeout. Where it is absent or fails
the mode is unknown (None), never a guess.
"""

from __future__ import annotations

import re
import shutil
import subprocess

_MODE = re.compile(r"NV Power Mode:\s*(\S+)")


def parse_nvpmodel_query(text: str) -> dict | None:
    """{"name": ..., "id": int or None} from ``nvpmodel -q`` output, or None when it names no mode."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        m = _MODE.search(line)
        if m:
            ident = lines[i + 1] if i + 1 < len(lines) else ""
            return {"name": m.group(1), "id": int(ident) if ident.isdigit() else None}
    return None


def read_power_mode(tool: str = "nvpmodel", timeout_s: float = 3.0) -> dict | None:
    path = shutil.which(tool)
    if path is None:
        return None
    try:
        out = subprocess.run([path, "-q"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvpmodel_query(out.stdout) if out.returncode == 0 else None


def describe_power_mode(mode: dict | None) -> str:
    if not mode:
        return "unknown (nvpmodel not readable)"
    return mode["name"] + (f" (nvpmodel {mode['id']})" if mode.get("id") is not None else "")
