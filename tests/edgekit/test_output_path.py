"""Output paths refused up front, in one line: what the user typed, what is wrong, what to do."""

from __future__ import annotations

import pytest

from edgekit.errors import OutputPathError
from edgekit.output_path import check_output_path


def test_a_new_path_under_writable_folders_is_accepted_and_nothing_is_left_behind(tmp_path):
    assert check_output_path(tmp_path / "new" / "deeper" / "bundle", "-o", kind="dir") == tmp_path / "new" / "deeper" / "bundle"
    assert list(tmp_path.iterdir()) == []  # the probe file is gone, no folder was created


def test_a_path_below_a_file_is_refused_naming_the_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputPathError, match=r"--log .*/f/sub/log.jsonl: .*/f is a file, not a directory"):
        check_output_path(tmp_path / "f" / "sub" / "log.jsonl", "--log")


def test_a_directory_where_a_file_goes_and_a_file_where_a_directory_goes_are_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputPathError, match="is a directory, expected a file path"):
        check_output_path(tmp_path, "-o", kind="file")
    with pytest.raises(OutputPathError, match="is a file, expected a directory"):
        check_output_path(tmp_path / "f", "-o", kind="dir")


def test_a_folder_nobody_can_create_files_in_is_refused_even_for_root():
    with pytest.raises(OutputPathError, match=r"-o /proc/edgekit-out/x: cannot write in /proc \("):
        check_output_path("/proc/edgekit-out/x", "-o", kind="dir")
