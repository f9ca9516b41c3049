"""BundleWriter: determinism, atomic appearance, refusals of bad paths and mismatched plugins."""

from __future__ import annotations

import os

import pytest
from bundle_builders import rmsnorm_metadata, rmsnorm_plugin_files, write_bundle

from edgekit.bundle.archive import list_tree, write_archive
from edgekit.bundle.keys import development_key
from edgekit.bundle.plugin import PluginMetadata
from edgekit.bundle.writer import BundleWriter
from edgekit.errors import BundleError


def _snapshot(d):
    return {rel: (d / rel).read_bytes() for rel in list_tree(d)}


def test_same_inputs_give_same_bytes_and_hashes(tmp_path, signing_key):
    a = write_bundle(tmp_path / "a", signing_key)
    b = write_bundle(tmp_path / "b", signing_key)
    assert _snapshot(a) == _snapshot(b)  # manifest.sig included: ed25519 is deterministic
    assert write_archive(a, tmp_path / "a.tar").read_bytes() == write_archive(b, tmp_path / "b.tar").read_bytes()


def test_dev_key_build_is_deterministic_and_flagged(tmp_path):
    a = write_bundle(tmp_path / "a", development_key())
    b = write_bundle(tmp_path / "b", development_key())
    assert _snapshot(a) == _snapshot(b)
    assert b'"dev_key":true' in (a / "manifest.json").read_bytes()


def test_different_content_gives_different_manifest(tmp_path, signing_key):
    a = write_bundle(tmp_path / "a", signing_key)
    b = write_bundle(tmp_path / "b", signing_key, weights=b"\x01" * 1000)
    assert (a / "manifest.json").read_bytes() != (b / "manifest.json").read_bytes()


def test_a_failed_build_leaves_nothing(tmp_path):
    out = tmp_path / "bundle"
    with pytest.raises(RuntimeError):
        with BundleWriter(out) as w:
            w.add_bytes("model.onnx", b"x")
            raise RuntimeError("compile failed")
    assert list(tmp_path.iterdir()) == []


def test_refuses_existing_output_unless_overwrite(tmp_path, signing_key):
    write_bundle(tmp_path / "b", signing_key)
    with pytest.raises(BundleError, match="already exists"):
        BundleWriter(tmp_path / "b")
    w = BundleWriter(tmp_path / "b", overwrite=True)
    w.abort()  # an aborted overwrite leaves the old bundle alone
    assert (tmp_path / "b" / "manifest.json").exists()


def test_overwrite_replaces_whole_bundle(tmp_path, signing_key):
    b = write_bundle(tmp_path / "b", signing_key)
    (b / "stale.txt").write_bytes(b"from an older build")
    with BundleWriter(b, overwrite=True) as w:
        w.add_bytes("model.onnx", b"new")
        w.finish(key=signing_key, **_manifest_fields())
    assert list_tree(b) == ["manifest.json", "manifest.sig", "model.onnx"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def _manifest_fields():
    from edgekit.bundle.manifest import Buckets, ModelIdentity, Target

    return dict(
        target=Target(name="orin", arch=87), model=ModelIdentity(name="m", source_kind="preset"), plan={}, precision={},
        buckets=Buckets(prompt_lengths=(32,), max_seq_len=64, batch=1), triton_version="3.6.0",
    )


@pytest.mark.parametrize("path", ["../x", "/abs", "manifest.json", "a/./b", "dir/.hidden"])
def test_refuses_unsafe_or_reserved_paths(tmp_path, path):
    with BundleWriter(tmp_path / "b") as w:
        with pytest.raises(BundleError):
            w.add_bytes(path, b"x")


def test_refuses_duplicates_and_file_directory_clashes(tmp_path):
    with BundleWriter(tmp_path / "b") as w:
        w.add_bytes("a/b", b"x")
        with pytest.raises(BundleError, match="already added"):
            w.add_bytes("a/b", b"y")
        with pytest.raises(BundleError, match="clashes"):
            w.add_bytes("a", b"y")
        with pytest.raises(BundleError, match="clashes"):
            w.add_bytes("a/b/c", b"y")


def test_add_file_streams_and_hashes(tmp_path):
    import hashlib

    src = tmp_path / "w.bin"
    src.write_bytes(os.urandom(3 << 20))
    with BundleWriter(tmp_path / "b") as w:
        e = w.add_file("weights/w.bin", src)
        assert (e.sha256, e.size) == (hashlib.sha256(src.read_bytes()).hexdigest(), 3 << 20)


def test_plugin_files_must_match_metadata(tmp_path):
    meta = PluginMetadata.model_validate(rmsnorm_metadata())
    files = rmsnorm_plugin_files()
    del files["kernel.ptx"]
    with BundleWriter(tmp_path / "b") as w:
        with pytest.raises(BundleError, match="do not match its metadata"):
            w.add_plugin(meta, files)


def test_plugin_for_another_arch_is_refused_at_finish(tmp_path, signing_key):
    meta = PluginMetadata.model_validate(rmsnorm_metadata(arch=90))
    with BundleWriter(tmp_path / "b") as w:
        w.add_plugin(meta, rmsnorm_plugin_files(arch=90))
        with pytest.raises(BundleError, match="compiled for sm_90; the bundle targets sm_87"):
            w.finish(key=signing_key, **_manifest_fields())
    assert not (tmp_path / "b").exists()


def test_add_tree_copies_a_directory_and_refuses_links(tmp_path):
    src = tmp_path / "tok"
    (src / "sub").mkdir(parents=True)
    (src / "tokenizer.json").write_bytes(b"{}")
    (src / "sub" / "merges.txt").write_bytes(b"a b")
    with BundleWriter(tmp_path / "b") as w:
        assert sorted(w.add_tree("tokenizer", src)) == ["tokenizer/sub/merges.txt", "tokenizer/tokenizer.json"]
        os.symlink("/etc/passwd", src / "evil")
        with pytest.raises(BundleError, match="symbolic link"):
            w.add_tree("tokenizer2", src)
