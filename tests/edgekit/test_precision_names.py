"""One precision vocabulary for every command: fp16, int8 (= W8A16, the default of plan and build), w8a8,
int4 (= W4A16); old spellings accepted with a note."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edgekit import cli
from edgekit.errors import ConfigError
from edgekit.precision_names import DEFAULT_PRECISION, PRECISIONS, parse_precision


def edgekit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgekit", *args], capture_output=True, text=True, timeout=300)


def test_names_and_aliases():
    assert set(PRECISIONS) == {"fp16", "int8", "w8a8", "int4"}
    notes = []
    assert parse_precision("W8A16", ("int8", "fp16"), warn=notes.append) == "int8"
    assert notes and "old name of int8" in notes[0]
    assert parse_precision("INT4", ("int8", "fp16", "int4")) == "int4"
    with pytest.raises(ConfigError, match=r"'int4' \(W4A16.* is not accepted here") as e:
        parse_precision("int4", ("int8", "fp16"))
    assert "int8, fp16" in str(e.value)
    with pytest.raises(ConfigError, match="not accepted here"):
        parse_precision("w8a8", ("int8", "fp16"))


def _precision_default(command: str) -> str:
    for p in cli.cli_command().commands[command].params:
        if p.name == "precision":
            return p.default
    raise AssertionError(f"{command} has no --precision")


def test_plan_build_and_quantize_share_the_default():
    assert _precision_default("plan") == _precision_default("quantize") == DEFAULT_PRECISION == "int8"
    # build's option is unset by default (a --plan decides it); without a plan the build takes the same default
    from edgekit.builder import pipeline

    assert _precision_default("build") is None and pipeline.DEFAULT_PRECISION is DEFAULT_PRECISION
    build_help = next(p.help for p in cli.cli_command().commands["build"].params if p.name == "precision")
    assert f"Default: {DEFAULT_PRECISION}" in build_help


def test_every_precision_option_offers_int4():
    for command in ("plan", "build", "quantize", "bench", "eval"):
        for p in cli.cli_command().commands[command].params:
            if p.name == "precision":
                assert "int4 (W4A16" in p.help and "not implemented" not in p.help, command


def test_plan_accepts_int4_and_costs_it():
    r = edgekit("plan", "preset:tiny", "--target", "orin", "--precision", "int4", "--no-tiles", "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert {s for layer in plan["precision"]["layers"] for s in layer.values()} == {"w4a16"}


def test_the_old_quantize_mode_spelling_still_works_with_a_note(tmp_path):
    r = edgekit("quantize", "preset:tiny", "--mode", "w8a16", "-o", str(tmp_path / "q"), "--ppl-tokens", "64",
                "--new-tokens", "4", "--no-cache", "--json")
    assert r.returncode == 0, r.stderr
    assert "--mode is the old name of --precision" in r.stderr and "w8a16 is the old name of int8" in r.stderr
    assert json.loads(r.stdout)["mode"] == "w8a16"  # the quantizer's own record of what it did


def _accepted_precisions(command: str) -> tuple[str, ...]:
    """The precisions `command`'s --precision help offers, in order (help_text writes 'name (description)')."""
    help_ = next(p.help for p in cli.cli_command().commands[command].params if p.name == "precision")
    return tuple(n for n in PRECISIONS if f"{n} (" in help_)


def test_plan_offers_every_precision_build_accepts():
    assert _accepted_precisions("plan") == _accepted_precisions("build") == tuple(PRECISIONS)


def test_plan_accepts_w8a8_and_build_reads_its_plan_as_w8a8(tmp_path):
    out = tmp_path / "w8a8-plan.json"
    r = edgekit("plan", "preset:tiny", "--target", "orin", "--precision", "w8a8", "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert {s for layer in plan["precision"]["layers"] for s in layer.values()} == {"w8a8"}
    from edgekit.builder.plan_contract import plan_precision, read_plan

    assert plan_precision(read_plan(out)) == "w8a8"  # what `edgekit build --plan` quantizes to
