"""The shared CLI plumbing: --json documents on stdout, strict JSON."""

from __future__ import annotations

import json
import math

import pytest

from edgekit import cli_common


def _refuse(constant: str):
    raise AssertionError(f"not strict JSON: {constant}")


def test_print_json_is_strict_json_with_null_for_non_finite_floats(capsys, monkeypatch):
    monkeypatch.setattr(cli_common, "_JSON_PRINTED", [])  # the flag this sets is process-wide
    doc = {"logits_snr_db": math.inf, "low": -math.inf, "nan": math.nan, "nested": [1.5, (math.inf, 2)], "ok": 3.0}
    cli_common.print_json(doc)
    back = json.loads(capsys.readouterr().out, parse_constant=_refuse)
    assert back == {"logits_snr_db": None, "low": None, "nan": None, "nested": [1.5, [None, 2]], "ok": 3.0}


def test_report_json_keeps_its_strings_for_non_finite_floats():
    from edgekit.quant.io import report_bytes

    assert json.loads(report_bytes({"snr": math.inf, "x": [math.nan]}), parse_constant=_refuse) == {"snr": "inf", "x": ["nan"]}


def test_monitor_json_lines_are_strict_json(capsys):
    """monitor --attach --json printed NaN for an empty window's jitter statistics (mean_ms, std_ms, ...)."""
    from edgekit.commands.power_commands import _emit

    _emit({"kind": "jitter", "evidence": {"mean_ms": math.nan, "max_ms": math.inf, "n": 0}})
    assert json.loads(capsys.readouterr().out, parse_constant=_refuse) == {
        "kind": "jitter", "evidence": {"mean_ms": None, "max_ms": None, "n": 0}}
