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


# ---- issue 19: bounds at their edges, each consistency refusal ------------------------------------------------------

from edgekit.bundle.manifest import MAX_MANIFEST_BYTES, Manifest, describe_validation_error  # noqa: E402


def _plugin_files(path="plugins/rmsnorm/1"):
    return {f"{path}/plugin.json": {"sha256": "c" * 64, "size": 1}, f"{path}/golden.safetensors": {"sha256": "d" * 64, "size": 1}}


@pytest.mark.parametrize("over, ok", [
    ({"target": {"name": "orin", "arch": 50}}, True), ({"target": {"name": "orin", "arch": 49}}, False),
    ({"target": {"name": "orin", "arch": 200}}, True), ({"target": {"name": "orin", "arch": 201}}, False),
    ({"target": {"name": "o" * 64, "arch": 87}}, True), ({"target": {"name": "o" * 65, "arch": 87}}, False),
    ({"model": {"name": "m" * 200, "source_kind": "preset", "sha256": None, "seed": 0}}, True),
    ({"model": {"name": "m" * 201, "source_kind": "preset", "sha256": None, "seed": 0}}, False),
    ({"model": {"name": "", "source_kind": "preset", "sha256": None, "seed": 0}}, False),
    ({"model": {"name": "m", "source_kind": "hf", "sha256": None, "seed": None}}, False),
    ({"files": {"w": {"sha256": "b" * 64, "size": 0}}}, True),
    ({"buckets": {"prompt_lengths": [1], "max_seq_len": 1, "batch": 1}}, True),
    ({"buckets": {"prompt_lengths": [128], "max_seq_len": 128, "batch": 1}}, True),
    ({"buckets": {"prompt_lengths": [129], "max_seq_len": 128, "batch": 1}}, False),
    ({"buckets": {"prompt_lengths": [0, 32], "max_seq_len": 128, "batch": 1}}, False),
    ({"buckets": {"prompt_lengths": [32, 32], "max_seq_len": 128, "batch": 1}}, False),
    ({"buckets": {"prompt_lengths": [], "max_seq_len": 128, "batch": 1}}, False),
    ({"buckets": {"prompt_lengths": [32], "max_seq_len": 0, "batch": 1}}, False),
    ({"buckets": {"prompt_lengths": [32], "max_seq_len": 128, "batch": 0}}, False),
    ({"edgekit_version": "1"}, True), ({"created_by": "c"}, True),
    ({"edgekit_version": "v" * 64}, True), ({"edgekit_version": "v" * 65}, False), ({"edgekit_version": ""}, False),
    ({"created_by": "c" * 200}, True), ({"created_by": "c" * 201}, False), ({"created_by": ""}, False),
    ({"triton_version": "3.6"}, True), ({"triton_version": "3"}, False), ({"triton_version": "3.6.0\n"}, False),
    ({"precision": {"rmsnorm": "FP16"}}, False), ({"precision": {"rmsnorm\n": "fp16"}}, False),
    ({"precision": {"rmsnorm": "fp16\n"}}, False),
    ({"plugins": [{"op": "rmsnorm", "version": 1, "abi_version": 1, "path": "plugins/rmsnorm/1"}],
      "files": _plugin_files()}, True),
    ({"plugins": [{"op": "r" * 65, "version": 1, "abi_version": 1, "path": f"plugins/{'r' * 65}/1"}],
      "files": _plugin_files(f"plugins/{'r' * 65}/1")}, False),
    ({"plugins": [{"op": "rmsnorm", "version": 0, "abi_version": 1, "path": "plugins/rmsnorm/0"}],
      "files": _plugin_files("plugins/rmsnorm/0")}, False),
    ({"plugins": [{"op": "rmsnorm", "version": 1, "abi_version": 0, "path": "plugins/rmsnorm/1"}],
      "files": _plugin_files()}, False),
])
def test_manifest_bounds_hold_at_their_edges(over, ok):
    data = canonical_json(_doc(**over))
    if ok:
        parse_manifest(data)
    else:
        with pytest.raises(VerificationError, match="schema"):
            parse_manifest(data)


def test_attack_plugin_listed_twice_is_refused():
    ref = {"op": "rmsnorm", "version": 1, "abi_version": 1, "path": "plugins/rmsnorm/1"}
    with pytest.raises(VerificationError, match="plugin rmsnorm version 1 is listed twice"):
        parse_manifest(canonical_json(_doc(plugins=[ref, ref], files=_plugin_files())))


@pytest.mark.parametrize("missing", ["plugin.json", "golden.safetensors"])
def test_attack_plugin_without_its_metadata_or_golden_file_is_refused(missing):
    files = {k: v for k, v in _plugin_files().items() if not k.endswith(missing)}
    ref = {"op": "rmsnorm", "version": 1, "abi_version": 1, "path": "plugins/rmsnorm/1"}
    with pytest.raises(VerificationError, match=f"plugins/rmsnorm/1/{missing} is not in files"):
        parse_manifest(canonical_json(_doc(plugins=[ref], files=files)))


@pytest.mark.parametrize("name", ["manifest.json", "manifest.sig"])
def test_attack_manifest_listing_its_own_files_is_refused(name):
    with pytest.raises(VerificationError, match=f"{name} cannot list itself"):
        parse_manifest(canonical_json(_doc(files={name: {"sha256": "b" * 64, "size": 1}})))


def test_manifest_size_limit_holds_at_its_edge():
    data = canonical_json(_doc())
    at_limit = data + b" " * (MAX_MANIFEST_BYTES - len(data))
    assert parse_manifest(at_limit).to_bytes() == data  # trailing whitespace is still the same JSON
    with pytest.raises(VerificationError, match=f"more than the {MAX_MANIFEST_BYTES} a manifest may have"):
        parse_manifest(at_limit + b" ")


@pytest.mark.parametrize("data, message", [(b"[1, 2]", "expected a JSON object, got list"), (b"\xff\xfe", "not valid JSON")])
def test_attack_manifest_that_is_not_an_object_is_refused(data, message):
    with pytest.raises(VerificationError, match=message):
        parse_manifest(data)


def test_plugin_files_are_those_under_the_plugin_directory():
    files = {**_plugin_files(), "plugins/rmsnorm/10/plugin.json": {"sha256": "e" * 64, "size": 1},
             **_plugin_files("plugins/rmsnorm/10"), "weights/w": {"sha256": "b" * 64, "size": 1}}
    refs = [{"op": "rmsnorm", "version": v, "abi_version": 1, "path": f"plugins/rmsnorm/{v}"} for v in (1, 10)]
    m = parse_manifest(canonical_json(_doc(plugins=refs, files=files)))
    assert sorted(m.plugin_files(m.plugins[0])) == ["golden.safetensors", "plugin.json"]  # not plugins/rmsnorm/10/...


def test_validation_errors_are_described_field_by_field_with_a_count():
    from pydantic import ValidationError

    try:
        Manifest.model_validate({})
    except ValidationError as e:
        text = describe_validation_error(e, limit=2)
    assert text.count("Field required") == 2 and text.endswith(f"; and {13 - 2} more")
    try:
        Manifest.model_validate(_doc(dev_key="yes"), strict=True)
    except ValidationError as e:
        assert describe_validation_error(e) == "dev_key: Input should be a valid boolean (got 'yes')"


def test_largest_bucket_is_the_last_one():
    with pytest.raises(VerificationError, match="largest bucket 129 exceeds max_seq_len 128"):
        parse_manifest(canonical_json(_doc(buckets={"prompt_lengths": [32, 129], "max_seq_len": 128, "batch": 1})))


def test_document_level_errors_are_located_at_the_document():
    ref = {"op": "rmsnorm", "version": 1, "abi_version": 1, "path": "plugins/rmsnorm/1"}
    with pytest.raises(VerificationError, match=r"schema: \(document\): Value error, plugin rmsnorm version 1"):
        parse_manifest(canonical_json(_doc(plugins=[ref, ref], files=_plugin_files())))


@pytest.mark.parametrize("n_errors, suffix", [(3, ""), (4, "; and 1 more"), (5, "; and 2 more")])
def test_the_first_three_errors_are_described_and_the_rest_counted(n_errors, suffix):
    from pydantic import ValidationError

    bad = {"format": 1, "format_version": "x", "edgekit_version": 2, "triton_version": 3, "created_by": 4}
    doc = _doc(**dict(list(bad.items())[:n_errors]))
    with pytest.raises(ValidationError) as e:
        Manifest.model_validate(doc, strict=True)
    assert e.value.error_count() == n_errors
    text = describe_validation_error(e.value)
    assert text.count(": ") == 3 + suffix.count(": ") and text.endswith(suffix or ")")


def test_manifest_model_cannot_be_altered():
    from pydantic import ValidationError

    m = parse_manifest(canonical_json(_doc()))
    with pytest.raises(ValidationError):
        m.dev_key = True
