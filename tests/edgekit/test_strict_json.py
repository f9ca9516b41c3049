"""edgekit/strict_json.py's file writer: the JSON files commands write (plan -o, bench --json)."""

from __future__ import annotations

import json
import math

from edgekit.strict_json import write_json_file


def _refuse(constant: str):
    raise AssertionError(f"not strict JSON: {constant}")


def test_write_json_file_creates_missing_parent_folders(tmp_path):
    """check_output_path accepts -o/--json FILE under missing folders, promising to create them (plan -o died with a
    FileNotFoundError after the work)."""
    out = tmp_path / "a" / "b" / "doc.json"
    write_json_file(out, {"x": 1})
    assert json.loads(out.read_text()) == {"x": 1}
    assert [p.name for p in out.parent.iterdir()] == ["doc.json"]


def test_write_json_file_is_strict_json_like_print_json(tmp_path):
    """bench --json wrote NaN where a power window had no time (power_w); plan -o the same writer."""
    out = tmp_path / "doc.json"
    write_json_file(out, {"power_w": math.nan, "rows": [{"x": math.inf}]})
    assert json.loads(out.read_text(), parse_constant=_refuse) == {"power_w": None, "rows": [{"x": None}]}
