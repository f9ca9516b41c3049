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



def test_an_empty_directory_made_beforehand_is_taken_without_force(tmp_path, signing_key):
    """`mkdir out && edgekit build -o out` was refused as "already exists" and asked for --force, though an empty
    directory holds nothing to lose; one that holds anything is still refused."""
    (tmp_path / "made").mkdir()
    with BundleWriter(tmp_path / "made") as w:
        w.add_bytes("model.onnx", b"x")
        w.finish(key=signing_key, **_manifest_fields())
    assert list_tree(tmp_path / "made") == ["manifest.json", "manifest.sig", "model.onnx"]
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(BundleError, match="not an edgekit bundle"):
        BundleWriter(tmp_path / "full")

def test_overwrite_replaces_whole_bundle(tmp_path, signing_key):
    b = write_bundle(tmp_path / "b", signing_key)
    (b / "stale.txt").write_bytes(b"from an older build")
    with BundleWriter(b, overwrite=True) as w:
        w.add_bytes("model.onnx", b"new")
        w.finish(key=signing_key, **_manifest_fields())
    assert list_tree(b) == ["manifest.json", "manifest.sig", "model.onnx"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_overwrite_never_replaces_a_directory_that_is_not_a_bundle(tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "important.txt").write_bytes(b"a user's data")
    with pytest.raises(BundleError, match="not an edgekit bundle.*important.txt"):
        BundleWriter(precious, overwrite=True)
    assert (precious / "important.txt").read_bytes() == b"a user's data"
    (tmp_path / "a-file").write_bytes(b"x")
    with pytest.raises(BundleError, match="is a file"):
        BundleWriter(tmp_path / "a-file", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "precious"]  # no partial directory left


def test_a_directory_that_is_not_a_bundle_is_not_offered_force(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_bytes(b"x")
    with pytest.raises(BundleError) as e:
        BundleWriter(tmp_path / "notes")
    assert "not an edgekit bundle" in e.value.message and "--force" not in (e.value.hint or "")


def test_a_symlinked_output_is_refused_naming_its_target(tmp_path, signing_key):
    real = write_bundle(tmp_path / "real", signing_key)
    (tmp_path / "current").symlink_to(real)
    with pytest.raises(BundleError, match="symbolic link"):
        BundleWriter(tmp_path / "current", overwrite=True)
    assert (tmp_path / "current").resolve() == real and (real / "manifest.json").exists()


def test_overwrite_takes_an_empty_directory(tmp_path, signing_key):
    (tmp_path / "empty").mkdir()
    with BundleWriter(tmp_path / "empty", overwrite=True) as w:
        w.add_bytes("model.onnx", b"new")
        w.finish(key=signing_key, **_manifest_fields())
    assert list_tree(tmp_path / "empty") == ["manifest.json", "manifest.sig", "model.onnx"]


@pytest.mark.parametrize("name", [".", "..", "sub/.."])
def test_the_current_directory_and_its_parents_are_refused(tmp_path, monkeypatch, name):
    (tmp_path / "work" / "sub").mkdir(parents=True)
    (tmp_path / "work" / "keep.txt").write_bytes(b"x")
    monkeypatch.chdir(tmp_path / "work")
    with pytest.raises(BundleError, match="current directory or one of its parents"):
        BundleWriter(name, overwrite=True)
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["keep.txt", "sub"]


def test_a_directory_swapped_in_during_the_build_is_not_replaced(tmp_path, signing_key):
    out = write_bundle(tmp_path / "b", signing_key)
    with pytest.raises(BundleError, match="not an edgekit bundle"):
        with BundleWriter(out, overwrite=True) as w:
            w.add_bytes("model.onnx", b"new")
            (out / "manifest.sig").unlink()  # someone else's directory now, not our old bundle
            w.finish(key=signing_key, **_manifest_fields())
    assert (out / "manifest.json").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


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


# ---- issue 19: what the writer writes, and each refusal --------------------------------------------------------------

import json  # noqa: E402
import stat  # noqa: E402

from edgekit.bundle.verify import verify_bundle  # noqa: E402


def test_written_files_are_0644_and_the_manifest_lists_them_sorted(tmp_path, signing_key, public_key):
    old = os.umask(0o077)
    try:
        src = tmp_path / "w.bin"
        src.write_bytes(b"w" * 10)
        with BundleWriter(tmp_path / "b") as w:
            w.add_bytes("z.bin", b"z")
            w.add_file("a/w.bin", src)
            w.add_plugin(PluginMetadata.model_validate(rmsnorm_metadata(2)), rmsnorm_plugin_files())
            w.add_plugin(PluginMetadata.model_validate(rmsnorm_metadata(1)), rmsnorm_plugin_files())
            m = w.finish(key=signing_key, **_manifest_fields())
    finally:
        os.umask(old)
    b = tmp_path / "b"
    assert {stat.S_IMODE((b / rel).stat().st_mode) for rel in list_tree(b)} == {0o644}
    assert list(json.loads((b / "manifest.json").read_bytes())["files"]) == sorted(m.files)
    assert [(p.op, p.version) for p in m.plugins] == [("rmsnorm", 1), ("rmsnorm", 2)]
    assert m.created_by == f"edgekit {m.edgekit_version}"
    assert verify_bundle(b, [public_key], run_golden=None, local_arch=None).ok


def test_versions_default_to_the_running_ones(tmp_path, signing_key):
    import triton

    from edgekit import __version__

    fields = _manifest_fields()
    fields.pop("triton_version")
    with BundleWriter(tmp_path / "b") as w:
        m = w.finish(key=signing_key, **fields, created_by="ci build 42")
    assert (m.triton_version, m.edgekit_version, m.created_by) == (triton.__version__, __version__, "ci build 42")


def test_the_same_plugin_cannot_be_added_twice(tmp_path):
    meta = PluginMetadata.model_validate(rmsnorm_metadata())
    with BundleWriter(tmp_path / "b") as w:
        w.add_plugin(meta, rmsnorm_plugin_files())
        with pytest.raises(BundleError, match="rmsnorm v1 was already added"):
            w.add_plugin(meta, rmsnorm_plugin_files())


def test_plugin_json_given_with_the_files_must_be_the_metadata(tmp_path, signing_key, public_key):
    meta = PluginMetadata.model_validate(rmsnorm_metadata())
    with BundleWriter(tmp_path / "b") as w:
        with pytest.raises(BundleError, match="differs from the metadata object"):
            w.add_plugin(meta, {**rmsnorm_plugin_files(), "plugin.json": PluginMetadata.model_validate(rmsnorm_metadata(3)).to_bytes()})
        w.add_plugin(meta, {**rmsnorm_plugin_files(), "plugin.json": meta.to_bytes()})
        w.finish(key=signing_key, **_manifest_fields())
    assert (tmp_path / "b/plugins/rmsnorm/1/plugin.json").read_bytes() == meta.to_bytes()


def test_an_output_that_appears_during_the_build_is_not_replaced(tmp_path, signing_key):
    w = BundleWriter(tmp_path / "b")
    (tmp_path / "b").mkdir()  # another build finished first (an empty directory would hold nothing to lose)
    (tmp_path / "b" / "manifest.json").write_bytes(b"{}")
    with pytest.raises(BundleError, match="appeared while building"):
        w.finish(key=signing_key, **_manifest_fields())
    w.abort()
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["manifest.json"]


def test_a_stale_partial_directory_of_this_process_is_replaced(tmp_path, signing_key):
    stale = tmp_path / f".b.partial-{os.getpid()}"
    stale.mkdir()
    (stale / "junk").write_bytes(b"x")
    with BundleWriter(tmp_path / "b") as w:
        w.finish(key=signing_key, **_manifest_fields())
    assert list_tree(tmp_path / "b") == ["manifest.json", "manifest.sig"]



def test_a_killed_builds_staging_folder_is_removed_and_a_running_ones_is_kept(tmp_path, signing_key):
    """A build killed with SIGKILL leaves its hidden `.NAME.partial-PID` folder: nothing read it, and nothing removed
    it, so each killed build's weights stayed on disk. The next build of that name removes the folders of processes
    that are gone; a live process's (another build at work) and another bundle's are left alone."""
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        killed = tmp_path / f".b.partial-{dead_pid}"
        running = tmp_path / f".b.partial-{alive.pid}"
        other = tmp_path / f".c.partial-{dead_pid}"
        for d in (killed, running, other):
            d.mkdir()
            (d / "weights").write_bytes(b"x" * 64)
        with BundleWriter(tmp_path / "b") as w:
            w.finish(key=signing_key, **_manifest_fields())
        assert not killed.exists()
        assert running.is_dir() and other.is_dir()
    finally:
        alive.kill()
        alive.wait()

def test_files_property_is_a_copy(tmp_path):
    with BundleWriter(tmp_path / "b") as w:
        w.add_bytes("a", b"1")
        w.files["b"] = None  # type: ignore[index]
        assert list(w.files) == ["a"]


def test_leaving_without_finish_discards_the_partial_bundle(tmp_path):
    with BundleWriter(tmp_path / "b") as w:
        w.add_bytes("a", b"1")
    assert list(tmp_path.iterdir()) == []


def test_unsigned_json_files_are_written_in_one_exact_readable_form():
    from edgekit.bundle.writer import pretty_json

    assert pretty_json({"b": [1], "a": "é"}) == '{\n  "a": "é",\n  "b": [\n    1\n  ]\n}\n'.encode("utf-8")
    with pytest.raises(ValueError):
        pretty_json({"x": float("nan")})


def test_given_versions_are_recorded_as_given(tmp_path, signing_key):
    fields = dict(_manifest_fields(), triton_version="3.5.0")
    with BundleWriter(tmp_path / "a" / "b") as w:  # parent directories are created
        m = w.finish(key=signing_key, **fields, edgekit_version="9.9.9")
    assert (m.triton_version, m.edgekit_version, m.created_by) == ("3.5.0", "9.9.9", "edgekit 9.9.9")


def test_abort_twice_is_harmless(tmp_path):
    w = BundleWriter(tmp_path / "b")
    w.abort()
    w.abort()
    assert list(tmp_path.iterdir()) == []


def test_add_plugin_returns_the_manifest_reference_it_will_write(tmp_path, signing_key):
    with BundleWriter(tmp_path / "b") as w:
        ref = w.add_plugin(PluginMetadata.model_validate(rmsnorm_metadata(3)), rmsnorm_plugin_files())
        m = w.finish(key=signing_key, **_manifest_fields())
    assert (ref.op, ref.version, ref.abi_version, ref.path) == ("rmsnorm", 3, 1, "plugins/rmsnorm/3")
    assert m.plugins == [ref]
