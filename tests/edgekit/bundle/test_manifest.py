"""Manifest schema: strictness, canonical bytes, format versions, unsafe paths."""

from __future__ import annotations

import json

import pytest

from edgekit.bundle.canonical import canonical_json, relpath_problem
from edgekit.bundle.manifest import parse_manifest
from edgekit.errors import VerificationError


def _doc(**over) -> dict:
    doc = {
        "format": "edgekit-bundle",
        "format_version": 1,
        "edgekit_version": "0.1.0",
        "triton_version": "3.6.0",
        "target": {"name": "orin", "arch": 87},
        "model": {"name": "m", "source_kind": "gguf", "sha256": "a" * 64, "seed": None},
        "plan": {"anything": [1, 2, {"x": 1.5}]},
        "precision": {"rmsnorm": "fp16"},
        "buckets": {"prompt_lengths": [32, 64], "max_seq_len": 128, "batch": 1},
        "files": {"weights/model.safetensors": {"sha256": "b" * 64, "size": 10}},
        "plugins": [],
        "created_by": "edgekit 0.1.0",
        "dev_key": False,
    }
    doc.update(over)
    return doc


def test_round_trip_is_byte_identical():
    data = canonical_json(_doc())
    m = parse_manifest(data)
    assert m.to_bytes() == data
    assert parse_manifest(m.to_bytes()) == m


def test_canonical_bytes_do_not_depend_on_key_order_or_whitespace():
    a = _doc()
    b = dict(reversed(list(a.items())))
    assert canonical_json(a) == canonical_json(b)
    pretty = json.dumps(a, indent=4).encode()
    assert parse_manifest(pretty).to_bytes() == canonical_json(a)


@pytest.mark.parametrize("version", [0, 2, 99, "1", None])
def test_attack_unknown_format_version_is_refused(version):
    with pytest.raises(VerificationError, match=f"format_version {version!r} is not supported") as e:
        parse_manifest(canonical_json(_doc(format_version=version)))
    assert e.value.file == "manifest.json"
    assert "upgrade edgekit" in str(e.value)


def test_attack_other_format_name_is_refused():
    with pytest.raises(VerificationError, match="not an edgekit bundle manifest"):
        parse_manifest(canonical_json(_doc(format="something-else")))


@pytest.mark.parametrize(
    "over, where",
    [
        ({"unexpected": 1}, "unexpected"),
        ({"files": {"w": {"sha256": "b" * 64, "size": "10"}}}, "files.w.size"),  # strict: no "10" -> 10
        ({"files": {"w": {"sha256": "B" * 64, "size": 10}}}, "files.w.sha256"),
        ({"files": {"w": {"sha256": "b" * 64, "size": -1}}}, "files.w.size"),
        ({"target": {"name": "orin", "arch": 87.0}}, "target.arch"),
        ({"model": {"name": "m", "source_kind": "gguf", "sha256": None, "seed": None}}, "sha256"),
        ({"buckets": {"prompt_lengths": [64, 32], "max_seq_len": 128, "batch": 1}}, "strictly increasing"),
        ({"dev_key": 0}, "dev_key"),
        ({"precision": {"RMSNorm": "fp16"}}, "lower-case"),
    ],
)
def test_attack_schema_violations_are_refused_naming_the_field(over, where):
    with pytest.raises(VerificationError, match="schema") as e:
        parse_manifest(canonical_json(_doc(**over)))
    assert where in str(e.value)


@pytest.mark.parametrize(
    "path",
    ["../outside", "/etc/passwd", "a/../../b", "a//b", "./a", "a\\b", "C:/x", ".hidden", "manifest.json", "a/b c"],
)
def test_attack_unsafe_file_paths_in_manifest_are_refused(path):
    with pytest.raises(VerificationError, match="file path|cannot list itself"):
        parse_manifest(canonical_json(_doc(files={path: {"sha256": "b" * 64, "size": 1}})))


def test_attack_path_used_as_file_and_directory_is_refused():
    files = {"a": {"sha256": "b" * 64, "size": 1}, "a/b": {"sha256": "b" * 64, "size": 1}}
    with pytest.raises(VerificationError, match="file and used as a directory"):
        parse_manifest(canonical_json(_doc(files=files)))


def test_plugin_refs_must_point_at_their_canonical_directory_and_files():
    ref = {"op": "rmsnorm", "version": 1, "abi_version": 1, "path": "plugins/other/1"}
    with pytest.raises(VerificationError, match="must be 'plugins/rmsnorm/1'"):
        parse_manifest(canonical_json(_doc(plugins=[ref])))
    ref["path"] = "plugins/rmsnorm/1"
    with pytest.raises(VerificationError, match="plugin.json is not in files"):
        parse_manifest(canonical_json(_doc(plugins=[ref])))


def test_relpath_problem_accepts_ordinary_bundle_paths():
    for p in ("manifest.json", "plugins/rmsnorm/3/kernel.cubin", "tokenizer/tokenizer.json", "golden/attention_decode.safetensors"):
        assert relpath_problem(p) is None, p


def test_not_json_is_refused():
    with pytest.raises(VerificationError, match="not valid JSON"):
        parse_manifest(b"\xff\xfe")
