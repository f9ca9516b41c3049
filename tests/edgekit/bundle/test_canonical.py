"""Canonical JSON, hashes, safe relative paths and atomic writes: the ground every signature stands on."""

from __future__ import annotations

import hashlib
import io
import os
import stat

import pytest

from edgekit.bundle.canonical import (
    MAX_PATH_CHARS,
    MAX_PATH_DEPTH,
    atomic_write_bytes,
    canonical_json,
    is_sha256_hex,
    relpath_problem,
    sha256_file,
    sha256_stream,
)


def test_canonical_json_is_one_exact_byte_string():
    doc = {"b": [1, 2.5, None, True], "a": {"z": "é", "y": "\u2603"}}
    assert canonical_json(doc) == '{"a":{"y":"\u2603","z":"é"},"b":[1,2.5,null,true]}'.encode("utf-8")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_attack_non_finite_numbers_cannot_be_signed(value):
    with pytest.raises(ValueError):
        canonical_json({"x": value})


@pytest.mark.parametrize("size", [0, 1, 5, 6, 13])
def test_stream_hash_and_size_do_not_depend_on_the_chunking(size):
    data = bytes(range(size))
    assert sha256_stream(io.BytesIO(data), chunk_bytes=5) == (hashlib.sha256(data).hexdigest(), size)


def test_file_hash_and_size(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * ((1 << 20) + 3))  # more than one default chunk
    assert sha256_file(tmp_path / "f") == (hashlib.sha256(b"x" * ((1 << 20) + 3)).hexdigest(), (1 << 20) + 3)


@pytest.mark.parametrize("s, ok", [("a" * 64, True), ("0f" * 32, True), ("A" * 64, False), ("a" * 63, False),
                                   ("a" * 65, False), ("g" * 64, False), ("a" * 64 + "\n", False)])
def test_sha256_hex_is_exactly_64_lower_case_hex_digits(s, ok):
    assert is_sha256_hex(s) is ok


@pytest.mark.parametrize("path", ["a", "weights/model.safetensors", "plugins/rmsnorm/1/kernel.cubin", "A_b-c.d",
                                  "x" * MAX_PATH_CHARS, "/".join("d" * MAX_PATH_DEPTH)])
def test_ordinary_paths_are_safe(path):
    assert relpath_problem(path) is None


@pytest.mark.parametrize("path, problem", [
    ("", "empty path"), (None, "empty path"),
    ("x" * (MAX_PATH_CHARS + 1), f"longer than {MAX_PATH_CHARS}"),
    ("/etc/passwd", "absolute path"), ("C:/x", "absolute path"), ("c:x", "absolute path"),
    ("a\\b", "backslash"), ("../x", "'..'"), ("a/../b", "'..'"),
    ("/".join("d" * (MAX_PATH_DEPTH + 1)), f"more than {MAX_PATH_DEPTH} path components"),
    ("a//b", "empty or '.'"), ("a/", "empty or '.'"), ("./a", "empty or '.'"),
    ("model.onnx\n", "outside"), ("weights/w\n/x", "outside"),  # Python's `$` also matches before a final newline
    (".hidden", "starts with '.' or '-'"), ("-rf", "starts with '.' or '-'"), ("a b", "outside"), ("caf\u00e9", "outside"),
])
def test_attack_paths_that_escape_or_alias_are_refused(path, problem):
    assert problem in (relpath_problem(path) or "")


@pytest.mark.parametrize("mode", [0o644, 0o600, 0o640])
def test_atomic_write_sets_the_exact_mode_whatever_the_umask(tmp_path, mode):
    old = os.umask(0o077)
    try:
        atomic_write_bytes(tmp_path / "f", b"data", mode=mode)
    finally:
        os.umask(old)
    assert (tmp_path / "f").read_bytes() == b"data"
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == mode


def test_atomic_write_default_mode_is_0644_and_replaces_the_old_file(tmp_path):
    (tmp_path / "f").write_bytes(b"old")
    os.chmod(tmp_path / "f", 0o600)
    atomic_write_bytes(tmp_path / "f", b"new")
    assert (tmp_path / "f").read_bytes() == b"new"
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]  # no temp file left


def test_atomic_write_never_writes_through_a_stale_temp_file_of_a_wider_mode(tmp_path):
    # a crash can leave a temp file (of any mode) next to the target: the next write must not reuse it, and the
    # leftover must carry the name start-up recovery deletes (edgekit.durable.is_temp_name)
    from edgekit.durable import is_temp_name

    stale = tmp_path / ".k.deadbeef.tmp"
    stale.write_bytes(b"left by a crash")
    os.chmod(stale, 0o666)
    atomic_write_bytes(tmp_path / "k", b"secret", mode=0o600)
    assert (tmp_path / "k").read_bytes() == b"secret"
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o600
    assert stale.read_bytes() == b"left by a crash" and is_temp_name(stale.name)


def test_atomic_write_that_fails_leaves_no_temp_file(tmp_path):
    with pytest.raises(TypeError):
        atomic_write_bytes(tmp_path / "f", "not bytes")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


class _Recording(io.BytesIO):
    def __init__(self, data):
        super().__init__(data)
        self.sizes = []

    def read(self, n=-1):
        self.sizes.append(n)
        return super().read(n)


def test_files_are_hashed_in_1_mib_reads_so_weights_never_sit_in_memory_whole():
    f = _Recording(b"x" * ((2 << 20) + 1))
    assert sha256_stream(f)[1] == (2 << 20) + 1
    assert set(f.sizes) == {1 << 20} and len(f.sizes) == 4  # 1 MiB, 1 MiB, 1 byte, end
