"""Values refused as typed on every path and number parameter (edgekit.cli_raw_values)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer

from edgekit.cli import cli_command
from edgekit.cli_raw_values import takes_floats, takes_paths
from edgekit.cli_usage import BadParameter


def _edgekit(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgekit", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def _parameters(which):
    def walk(command):
        yield from ((command, p) for p in getattr(command, "params", []) if which(p))
        for sub in (getattr(command, "commands", None) or {}).values():
            yield from walk(sub)

    return list(walk(cli_command()))


@pytest.mark.parametrize("args", [("keys", "generate", ""), ("keys", "generate", "  "), ("report", "log.jsonl", "-o", ""),
                                  ("verify", "bundle", "--trust", "")])
def test_an_empty_path_is_refused_not_taken_as_the_current_directory(tmp_path, args):
    """typer turned "" into Path('.'): `keys generate "$DIR"` with DIR unset wrote a private key into the current
    directory, and `report LOG -o ''` its files there too."""
    r = _edgekit(*args, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "an empty path (an unset shell variable?)" in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written where the command ran


def test_every_path_parameter_refuses_an_empty_value():
    """The refusal is put on each path parameter as the command tree is built: a new command's path gets it too."""
    checked = _parameters(takes_paths)
    assert len(checked) > 40  # build -o, verify BUNDLE, --trust, ... (every command's files)
    for command, param in checked:
        with pytest.raises(BadParameter, match="an empty path"):
            param.process_value(typer.Context(command), [""] if param.multiple else "")


@pytest.mark.parametrize("args", [("serve", "b", "--max-queue-wait-ms", "inf"), ("bench", "--time-budget-s", "nan"),
                                  ("monitor", "--power-band-w", "Infinity", "--json"),
                                  ("generate", "preset:tiny", "--temperature", "-inf")])
def test_a_number_given_as_nan_or_inf_is_refused_saying_so(args):
    """`serve --max-queue-wait-ms inf` passed the option's minimum and turned the deadline off; `bench
    --time-budget-s nan` was refused as "Input should be greater than or equal to 1"."""
    r = _edgekit(*args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    given = args[args.index(next(a for a in args if a.lstrip("-").lower() in ("inf", "nan", "infinity")))]
    assert f"got {given!r}; expected a finite number" in r.stderr, r.stderr
    if "--json" in args:
        assert "expected a finite number" in json.loads(r.stdout)["error"]["message"]


def test_every_number_parameter_refuses_nan_and_inf_and_takes_a_number():
    checked = _parameters(takes_floats)
    assert len(checked) > 15  # serve's deadlines, monitor's budgets, quantize's thresholds, ...
    for command, param in checked:
        for text in ("nan", "inf", "-inf"):
            with pytest.raises(BadParameter, match="expected a finite number"):
                param.process_value(typer.Context(command), text)
        lowest = param.min if param.min is not None else 1.0  # a number in range still passes
        assert param.process_value(typer.Context(command), str(lowest)) == pytest.approx(lowest), param.name
