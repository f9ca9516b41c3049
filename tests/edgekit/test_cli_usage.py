"""Usage errors of every command, as a user meets them: one line, the closest valid flag, exit 2, no traceback.

The commands are enumerated from the CLI itself, so a new command is covered without editing this file.
Each case is a real `python -m edgekit` subprocess.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from edgekit import cli


def _commands():
    out = []

    def walk(cmd, path):
        out.append((path, [p for p in cmd.params if p.required]))
        for name, sub in sorted((getattr(cmd, "commands", None) or {}).items()):
            walk(sub, path + [name])

    walk(cli.cli_command(), [])
    return out


COMMANDS = _commands()


def edgekit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgekit", *args], capture_output=True, text=True, timeout=120)


def _assert_one_line_usage_error(r: subprocess.CompletedProcess, *expected: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for e in expected:
        assert e in lines[0], (e, lines[0])


def test_every_command_is_enumerated():
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"", "build", "serve", "store rollback", "targets show", "keys generate"} <= names


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "edgekit")
def test_unknown_flag(path):
    r = edgekit(*path, "--definitely-not-a-flag")
    _assert_one_line_usage_error(r, "no such option", "--definitely-not-a-flag", f"`{' '.join(['edgekit', *path])} --help`")


@pytest.mark.parametrize("path", [p for p, req in COMMANDS if req and p], ids=lambda p: " ".join(p))
def test_missing_required_argument(path):
    r = edgekit(*path)
    _assert_one_line_usage_error(r, "missing")


@pytest.mark.parametrize(
    "args, expected",
    [
        (("generate", "--promt", "hi"), "did you mean --prompt?"),
        (("plan", "--taget", "orin"), "--target"),
        (("plan", "--batch", "0"), "'--batch'"),
        (("genrate",), "'generate'"),
        (("serve",), "'BUNDLE'"),
    ],
)
def test_the_closest_valid_flag_or_command_is_named(args, expected):
    _assert_one_line_usage_error(edgekit(*args), expected)


def test_a_bare_group_prints_its_help_and_exits_2():
    for path in ([], ["store"], ["keys"]):
        r = edgekit(*path)
        assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout
        assert "Usage: edgekit" in r.stdout + r.stderr


INTERNAL_WORDS = ("the issue", "issue's", "GPU machine", "product card", "<bool>")


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "edgekit")
def test_help_has_no_placeholders_or_internal_words(path):
    r = edgekit(*path, "--help")
    assert r.returncode == 0, r.stderr
    for word in INTERNAL_WORDS:
        assert word.lower() not in r.stdout.lower(), (word, path)
    # a constant's name means nothing to a user; environment variables and GGUF type names do
    import re

    names = set(re.findall(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b", r.stdout)) - {"Q4_1", "Q4_K_M", "Q8_0", "Q4_0", "Q4_K"}
    assert all(n.startswith("EDGEKIT_") for n in names), (names, path)


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS if p], ids=lambda p: " ".join(p))
def test_help_at_80_columns_shows_every_flag_name_whole(path):
    """`serve --help` in an 80-column terminal showed `--admin-token-fi…`: every option's full name must appear."""
    import os

    r = subprocess.run([sys.executable, "-m", "edgekit", *path, "--help"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout and max(map(len, r.stdout.splitlines())) <= 80
    from edgekit.cli import cli_command

    command = cli_command()
    for name in path:
        command = command.commands[name]
    for param in command.params:
        for flag in (*param.opts, *param.secondary_opts):
            if flag.startswith("--") and not param.hidden:
                assert flag in r.stdout, flag


def test_value_names_come_from_clicks_own_types_under_a_typer_without_display_type():
    """typer before 0.2x runs click's options, which have no `display_type`: `edgekit` died on every command there
    (the H200 image's typer, 2026-12-04) before it parsed a flag."""
    import click

    from edgekit.cli import _value_name

    names = {t: _value_name(click.Option(["--x"], type=t), None)
             for t in (click.INT, click.IntRange(0, 3), click.FLOAT, click.Path(), click.File(), click.STRING)}
    assert list(names.values()) == ["INT", "INT", "NUM", "PATH", "PATH", "TEXT"]
