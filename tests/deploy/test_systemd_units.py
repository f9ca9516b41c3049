"""The systemd units shipped in deploy/systemd: valid for systemd, hardened, restarted on failure, stopped gently,
and their command lines made of options edgekit really has (a renamed flag must not break a device's boot)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
BINARY = "/opt/edgekit/venv/bin/edgekit"


def _unit(name: str) -> dict[str, list[str]]:
    """key -> values of a unit file (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", (UNITS / name).read_text())
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            k, v = line.split("=", 1)
            out.setdefault(k.strip(), []).append(v.strip())
    return out


def _units() -> list[str]:
    return sorted(p.name for p in UNITS.glob("*.service"))


def test_there_is_a_unit_for_serve_and_for_agent():
    assert _units() == ["edgekit-agent.service", "edgekit-serve.service"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_the_units_pass_systemd_analyze_verify_and_are_hardened(tmp_path):
    fake = tmp_path / "edgekit"  # verify checks that ExecStart's program exists and is executable
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    copies = []
    for name in _units():
        (tmp_path / name).write_text((UNITS / name).read_text().replace(BINARY, str(fake)))
        copies.append(str(tmp_path / name))
    r = subprocess.run(["systemd-analyze", "verify", *copies], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stdout + r.stderr
    for unit in copies:
        r = subprocess.run(["systemd-analyze", "security", "--offline=yes", unit], capture_output=True, text=True,
                           timeout=60)
        exposure = float(re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout + r.stderr).group(1))
        assert exposure <= 4.0, (unit, exposure)  # "OK" in systemd's scale (0 safest, 10 unprotected)


@pytest.mark.parametrize("name", _units())
def test_a_unit_restarts_on_failure_and_gives_a_clean_stop_time(name):
    u = _unit(name)
    assert u["Restart"] == ["on-failure"] and u["KillSignal"] == ["SIGTERM"]
    assert 10 <= int(u["TimeoutStopSec"][0]) <= 60
    assert u["User"] == ["edgekit"] and u["NoNewPrivileges"] == ["yes"] and u["ProtectSystem"] == ["strict"]


@pytest.mark.parametrize("name", _units())
def test_a_units_command_line_uses_only_options_the_command_has(name):
    from edgekit.cli import cli_command

    argv = shlex.split(_unit(name)["ExecStart"][0])
    assert argv[0] == BINARY
    command = cli_command().commands[argv[1]]
    known = {flag for p in command.params for flag in (*p.opts, *p.secondary_opts)}
    flags = [a for a in argv[2:] if a.startswith("--")]
    assert flags and set(flags) <= known, set(flags) - known
    if argv[1] == "serve":
        assert argv[argv.index("--host") + 1] == "127.0.0.1"  # loopback unless someone decides otherwise


def test_the_serve_unit_counts_a_stop_during_start_as_clean():
    """serve stopped while its bundle loads exits 143 through its clean-up (cli_common.end_on_sigterm); systemd counts
    only 0 and death by SIGTERM as clean unless told, so the unit named 143 a clean stop too."""
    from edgekit.cli_common import TERMINATED_EXIT_CODE

    assert _unit("edgekit-serve.service")["SuccessExitStatus"] == [str(TERMINATED_EXIT_CODE)]
