"""Bundle verification: every refusal names the file and the reason; a good bundle passes."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile

import pytest
from bundle_builders import rmsnorm_metadata, resign, write_bundle

from edgekit.bundle.archive import list_tree, write_archive
from edgekit.bundle.canonical import canonical_json
from edgekit.bundle.golden import run_reference
from edgekit.bundle.keys import development_key
from edgekit.bundle.verify import verify_bundle, verify_bundle_bytes, verify_manifest
from edgekit.errors import VerificationError


def _fails(report):
    return [(c.check, c.file, c.reason) for c in report.failures]


def test_good_bundle_passes_every_check(bundle, public_key, signing_key):
    r = verify_bundle(bundle, [public_key], local_arch=None)
    assert r.ok, _fails(r)
    kinds = {c.check for c in r.checks}
    assert {"signature", "manifest", "file", "plugin", "arch", "golden"} <= kinds
    assert r.key_id == signing_key.key_id
    assert sum(c.check == "golden" and c.status == "pass" for c in r.checks) == 2  # plugin + model-level vectors
    r.raise_if_failed()  # no exception


def test_good_archive_passes(bundle, tmp_path, public_key):
    tar = write_archive(bundle, tmp_path / "bundle.tar")
    r = verify_bundle(tar, [public_key], local_arch=None)
    assert r.ok, _fails(r)
    assert r.checks[0].check == "archive" and r.checks[0].status == "pass"


def test_pure_verification_of_bytes(bundle, public_key):
    files = {rel: (bundle / rel).read_bytes() for rel in list_tree(bundle)}
    assert verify_bundle_bytes(files, [public_key]).ok
    files["model.onnx"] += b"!"
    assert _fails(verify_bundle_bytes(files, [public_key]))[0][1] == "model.onnx"


def test_attack_tampered_byte_in_every_file_is_refused(tmp_path, signing_key, public_key):
    """Flip one byte in each file in turn; verification must name exactly that file."""
    pristine = write_bundle(tmp_path / "pristine", signing_key)
    for rel in list_tree(pristine):
        b = tmp_path / f"t-{rel.replace('/', '_')}"
        shutil.copytree(pristine, b)
        blob = bytearray((b / rel).read_bytes())
        blob[len(blob) // 2] ^= 0x01
        (b / rel).write_bytes(bytes(blob))
        r = verify_bundle(b, [public_key], run_golden=None, local_arch=None)
        assert not r.ok, rel
        check, file, reason = _fails(r)[0]
        if rel == "manifest.json":
            assert (file, check) == ("manifest.sig", "signature") and "does not match the bytes of manifest.json" in reason
        elif rel == "manifest.sig":
            assert file == "manifest.sig"
        else:
            assert file == rel and "sha256" in reason and "modified" in reason, (rel, _fails(r))
        shutil.rmtree(b)


def test_attack_missing_file_is_refused(bundle, public_key):
    os.remove(bundle / "plugins/rmsnorm/1/kernel.cubin")
    r = verify_bundle(bundle, [public_key], local_arch=None)
    assert ("file", "plugins/rmsnorm/1/kernel.cubin", "missing: listed in the manifest but not in the bundle") in _fails(r)
    # the plugin whose file is gone is not parsed, and says why
    assert any(c.check == "plugin" and c.status == "skip" for c in r.checks)


def test_attack_missing_signature_is_refused(bundle, public_key):
    os.remove(bundle / "manifest.sig")
    r = verify_bundle(bundle, [public_key], local_arch=None)
    assert _fails(r)[0][1] == "manifest.sig" and "missing" in _fails(r)[0][2]


def test_attack_extra_file_is_refused(bundle, public_key):
    (bundle / "plugins/rmsnorm/1/extra.so").write_bytes(b"\x7fELF")
    r = verify_bundle(bundle, [public_key], local_arch=None)
    assert _fails(r) == [("file", "plugins/rmsnorm/1/extra.so", "extra file: not listed in the signed manifest")]


def test_attack_symlink_inside_bundle_is_refused(bundle, public_key):
    os.remove(bundle / "model.onnx")
    os.symlink("/etc/passwd", bundle / "model.onnx")
    r = verify_bundle(bundle, [public_key], local_arch=None)
    assert _fails(r)[0][1] == "model.onnx" and "symbolic link" in _fails(r)[0][2]


def test_attack_manifest_signed_by_untrusted_key_is_refused(tmp_path, other_key, public_key):
    b = write_bundle(tmp_path / "b", other_key)
    r = verify_bundle(b, [public_key], local_arch=None)
    assert len(r.failures) == 1
    check, file, reason = _fails(r)[0]
    assert (check, file) == ("signature", "manifest.sig") and "not trusted" in reason
    assert r.manifest is None  # nothing else is believed


def test_attack_wrong_format_version_is_refused(bundle, signing_key, public_key):
    resign(bundle, signing_key, lambda d: d.update(format_version=2))
    r = verify_bundle(bundle, [public_key], local_arch=None)
    assert _fails(r) == [("manifest", "manifest.json", _fails(r)[0][2])]
    assert "format_version 2 is not supported" in _fails(r)[0][2]


def test_attack_plugin_metadata_out_of_range_is_refused(bundle, signing_key, public_key):
    """A validly signed bundle (attacker holds a key, or a buggy builder) with num_warps = 3."""
    meta = rmsnorm_metadata()
    meta["kernels"][0]["num_warps"] = 3
    (bundle / "plugins/rmsnorm/1/plugin.json").write_bytes(canonical_json(meta))
    resign(bundle, signing_key)
    r = verify_bundle(bundle, [public_key], local_arch=None)
    assert [(c, f) for c, f, _ in _fails(r)] == [("plugin", "plugins/rmsnorm/1/plugin.json")]
    assert "num_warps 3 is not one of" in _fails(r)[0][2]
    (skipped,) = [c for c in r.checks if c.check == "golden" and c.file == "plugins/rmsnorm/1/golden.safetensors"]
    assert skipped.status == "skip"  # a refused plugin's kernels are never run


def test_attack_plugin_for_another_arch_than_the_bundle(bundle, signing_key, public_key):
    meta = rmsnorm_metadata(arch=90)
    (bundle / "plugins/rmsnorm/1/plugin.json").write_bytes(canonical_json(meta))
    resign(bundle, signing_key)
    r = verify_bundle(bundle, [public_key], local_arch=None)
    assert "arch 90 differs from the manifest's 87" in _fails(r)[0][2]


def test_attack_golden_vectors_that_disagree_are_refused(bundle, public_key):
    """The implementation on this machine does not meet the tolerance (a subtly wrong kernel)."""

    def off_by_a_bit(op, inputs, attrs, plugin):
        return run_reference(op, inputs, attrs) * 1.01

    r = verify_bundle(bundle, [public_key], run_golden=off_by_a_bit, local_arch=None)
    fails = _fails(r)
    assert {f for _, f, _ in fails} == {"plugins/rmsnorm/1/golden.safetensors#t4", "golden/rmsnorm.safetensors#t4"}
    assert all(c == "golden" and "outside tolerance" in reason and " at y[" in reason for c, _, reason in fails)


def test_golden_runner_is_told_which_plugin(bundle, public_key):
    seen = []

    def spy(op, inputs, attrs, plugin):
        seen.append((op, plugin))
        return run_reference(op, inputs, attrs)

    assert verify_bundle(bundle, [public_key], run_golden=spy, local_arch=None).ok
    assert seen == [("rmsnorm", "plugins/rmsnorm/1"), ("rmsnorm", None)]


def test_attack_dev_key_bundle_is_refused_unless_allowed(tmp_path, public_key):
    b = write_bundle(tmp_path / "b", development_key())
    assert json.loads((b / "manifest.json").read_bytes())["dev_key"] is True
    r = verify_bundle(b, [public_key], local_arch=None)
    assert _fails(r)[0][:2] == ("signature", "manifest.sig") and "development key" in _fails(r)[0][2]
    r = verify_bundle(b, [public_key, development_key().public_key], local_arch=None)  # trusting it is not enough
    assert "development key" in _fails(r)[0][2]
    r = verify_bundle(b, [], allow_dev_key=True, local_arch=None)
    assert r.ok and any(c.check == "signature" and c.status == "warn" for c in r.checks)


def test_attack_manifest_hiding_dev_key_use_is_refused(tmp_path):
    b = write_bundle(tmp_path / "b", development_key())
    resign(b, development_key(), lambda d: d.update(dev_key=False))
    with pytest.raises(VerificationError, match="records dev_key: false but was signed with the development key"):
        verify_manifest((b / "manifest.json").read_bytes(), (b / "manifest.sig").read_bytes(), [], allow_dev_key=True)


def _tar_with(bundle, tmp_path, name, kind, link=""):
    tar = write_archive(bundle, tmp_path / "src.tar")
    out = tmp_path / "evil.tar"
    with tarfile.open(tar) as src, tarfile.open(out, "w") as dst:
        for m in src.getmembers():
            dst.addfile(m, src.extractfile(m))
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, link
        data = b"x" if kind == tarfile.REGTYPE else b""
        info.size = len(data)
        dst.addfile(info, io.BytesIO(data) if data else None)
    return out


@pytest.mark.parametrize(
    "name, kind, link, reason",
    [
        ("../../etc/evil", tarfile.REGTYPE, "", "'..'"),
        ("/etc/evil", tarfile.REGTYPE, "", "absolute path"),
        ("evil_link", tarfile.SYMTYPE, "/etc/passwd", "symbolic link"),
        ("evil_hard", tarfile.LNKTYPE, "manifest.json", "hard link"),
    ],
)
def test_attack_archive_tricks_are_refused_by_verify(bundle, tmp_path, public_key, name, kind, link, reason):
    evil = _tar_with(bundle, tmp_path, name, kind, link)
    r = verify_bundle(evil, [public_key], local_arch=None)
    assert not r.ok
    check, file, why = _fails(r)[0]
    assert check == "archive" and file == f"evil.tar:{name}" and reason in why


def test_arch_is_reported_not_enforced(bundle, public_key):
    def arch_check(local):
        r = verify_bundle(bundle, [public_key], run_golden=None, local_arch=local)
        (c,) = [c for c in r.checks if c.check == "arch"]
        return r.ok, c.status, c.reason

    assert arch_check(87)[:2] == (True, "pass")
    ok, status, reason = arch_check(90)
    assert ok and status == "warn" and "PTX is JIT-compiled" in reason
    assert arch_check(None)[:2] == (True, "skip")


@pytest.mark.parametrize("local, reason", [
    (None, "no CUDA GPU here; the bundle targets orin (sm_87); golden vectors run on the CPU reference"),
    (87, "this GPU is sm_87, the bundle's target arch: the cubins load here"),
    (90, "this GPU is sm_90, the bundle targets sm_87: cubins will not load, the PTX is JIT-compiled"),
    (80, "this GPU is sm_80, older than the target sm_87: the plugins cannot run here"),
])
def test_arch_reasons_name_both_archs(bundle, public_key, local, reason):
    r = verify_bundle(bundle, [public_key], run_golden=None, local_arch=local)
    assert [c.reason for c in r.checks if c.check == "arch"] == [reason]
    assert r.to_dict()["target"] == {"name": "orin", "arch": "sm_87"}


def test_verify_never_modifies_the_bundle(bundle, public_key):
    before = {rel: (bundle / rel).read_bytes() for rel in list_tree(bundle)}
    verify_bundle(bundle, [public_key], local_arch=None)
    assert {rel: (bundle / rel).read_bytes() for rel in list_tree(bundle)} == before


# ---- issue 19: a file changed while being verified, special files, each refusal on its own -------------------------

import threading  # noqa: E402

from bundle_builders import rmsnorm_golden  # noqa: E402

from edgekit.bundle import verify as verify_module  # noqa: E402


def _swap_after_hashing(monkeypatch, bundle, rel, new_bytes):
    """The attacker replaces `rel` right after the verifier hashed it (time of check / time of use)."""
    real = verify_module.sha256_file

    def hash_then_swap(path):
        digest = real(path)
        if str(path).endswith(rel):
            (bundle / rel).write_bytes(new_bytes)
        return digest

    monkeypatch.setattr(verify_module, "sha256_file", hash_then_swap)


def test_attack_plugin_metadata_swapped_after_hashing_is_refused(bundle, public_key, monkeypatch):
    swapped = rmsnorm_metadata()
    swapped["kernels"][0]["num_warps"] = 8  # a valid plugin.json, just not the signed one
    _swap_after_hashing(monkeypatch, bundle, "plugins/rmsnorm/1/plugin.json", canonical_json(swapped))
    r = verify_bundle(bundle, [public_key], local_arch=None)
    assert ("plugin", "plugins/rmsnorm/1/plugin.json", "changed while the bundle was being verified") in _fails(r)


def test_attack_golden_file_swapped_after_hashing_is_refused(bundle, public_key, monkeypatch):
    _swap_after_hashing(monkeypatch, bundle, "golden/rmsnorm.safetensors", rmsnorm_golden(seed=7))  # valid, unsigned
    r = verify_bundle(bundle, [public_key], local_arch=None)
    assert _fails(r) == [("golden", "golden/rmsnorm.safetensors", "changed while the bundle was being verified")]


def test_attack_fifo_inside_a_bundle_is_refused_without_hanging(bundle, public_key):
    """Opening a FIFO to hash it would block forever: it must be refused from its directory entry."""
    os.mkfifo(bundle / "weights" / "pipe")
    result = {}
    worker = threading.Thread(target=lambda: result.update(r=verify_bundle(bundle, [public_key], local_arch=None)),
                              daemon=True)
    worker.start()
    worker.join(timeout=60)
    if worker.is_alive():  # unblock the reader so the thread ends, then fail
        fd = os.open(bundle / "weights" / "pipe", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        worker.join(timeout=10)
        pytest.fail("verification hung opening a FIFO inside the bundle")
    assert _fails(result["r"]) == [("file", "weights/pipe", "is not a regular file (device, FIFO or socket)")]


def test_attack_manifest_or_signature_that_is_a_symlink_counts_as_missing(bundle, public_key, tmp_path):
    os.rename(bundle / "manifest.sig", tmp_path / "elsewhere.sig")
    os.symlink(tmp_path / "elsewhere.sig", bundle / "manifest.sig")
    r = verify_bundle(bundle, [public_key], local_arch=None)
    assert _fails(r)[0][:2] == ("signature", "manifest.sig") and "missing" in _fails(r)[0][2]


def test_missing_manifest_is_refused_and_nothing_else_is_checked(bundle, public_key):
    os.remove(bundle / "manifest.json")
    r = verify_bundle(bundle, [public_key], local_arch=None)
    assert [(c.check, c.file, c.status) for c in r.checks] == [("manifest", "manifest.json", "fail")]
    assert r.manifest is None and r.to_dict()["plugins"] == [] and r.to_dict()["target"] is None


def test_nonexistent_bundle_path_is_a_clear_error(tmp_path, public_key):
    with pytest.raises(VerificationError, match="no such bundle directory or archive"):
        verify_bundle(tmp_path / "nope", [public_key], local_arch=None)


def test_attack_file_of_the_right_hash_but_wrong_size_is_refused(bundle, signing_key, public_key):
    resign(bundle, signing_key, lambda d: d["files"]["model.onnx"].update(size=d["files"]["model.onnx"]["size"] + 1))
    r = verify_bundle(bundle, [public_key], local_arch=None)
    assert _fails(r) == [("file", "model.onnx", "size 13 bytes, the manifest says 14")]


def test_attack_plugin_metadata_disagreeing_with_the_manifest_is_refused(bundle, signing_key, public_key):
    for key, value, message in (("version", 2, "version 2 differs from the manifest's 1"),
                                ("abi_version", 2, "abi_version 2 differs from the manifest's 1")):
        meta = rmsnorm_metadata()
        meta[key] = value
        (bundle / "plugins/rmsnorm/1/plugin.json").write_bytes(canonical_json(meta))
        resign(bundle, signing_key)
        r = verify_bundle(bundle, [public_key], run_golden=None, local_arch=None)
        assert _fails(r) == [("plugin", "plugins/rmsnorm/1/plugin.json", message)]


def test_attack_plugin_directory_with_a_file_plugin_json_does_not_name_is_refused(bundle, signing_key, public_key):
    (bundle / "plugins/rmsnorm/1/payload.so").write_bytes(b"\x7fELF")
    resign(bundle, signing_key)  # a signer who lists the extra file: the plugin still does not need it
    r = verify_bundle(bundle, [public_key], run_golden=None, local_arch=None)
    (fail,) = _fails(r)
    assert fail[:2] == ("plugin", "plugins/rmsnorm/1/plugin.json") and "unexpected ['payload.so']" in fail[2]


def test_attack_plugin_for_an_unknown_abi_or_with_a_non_elf_cubin_is_refused(bundle, signing_key, public_key):
    (bundle / "plugins/rmsnorm/1/kernel.cubin").write_bytes(b"not ELF")
    resign(bundle, signing_key)
    r = verify_bundle(bundle, [public_key], local_arch=None)
    assert _fails(r) == [("plugin", "plugins/rmsnorm/1/kernel.cubin", "not a cubin (no ELF header)")]
    (skipped,) = [c for c in r.checks if c.check == "golden" and c.file == "plugins/rmsnorm/1/golden.safetensors"]
    assert skipped.status == "skip" and "failed its plugin checks" in skipped.reason


def test_golden_file_that_failed_its_hash_is_not_run(bundle, public_key):
    (bundle / "golden/rmsnorm.safetensors").write_bytes(rmsnorm_golden(seed=9))
    r = verify_bundle(bundle, [public_key], local_arch=None)
    (g,) = [c for c in r.checks if c.check == "golden" and c.file.startswith("golden/")]
    assert (g.status, g.reason) == ("skip", "not run: the file failed its hash check")


def test_attack_unreadable_golden_file_is_a_failed_check(bundle, signing_key, public_key):
    (bundle / "golden/rmsnorm.safetensors").write_bytes(b"\0" * 16)
    resign(bundle, signing_key)
    r = verify_bundle(bundle, [public_key], local_arch=None)
    (fail,) = _fails(r)
    assert fail[:2] == ("golden", "golden/rmsnorm.safetensors") and "safetensors" in fail[2]


def test_golden_vectors_can_be_skipped_and_the_report_says_so(bundle, public_key):
    r = verify_bundle(bundle, [public_key], run_golden=None, local_arch=None)
    assert r.ok and [(c.status, c.reason) for c in r.checks if c.check == "golden"] == [
        ("skip", "golden vectors not run (disabled)")]


def test_report_json_and_raise_name_the_first_failure(bundle, public_key):
    os.remove(bundle / "model.onnx")
    (bundle / "extra.bin").write_bytes(b"x")
    r = verify_bundle(bundle, [public_key], run_golden=None, local_arch=None)
    d = r.to_dict()
    assert d["ok"] is False and d["failures"] == 2 and d["target"] == {"name": "orin", "arch": "sm_87"}
    assert d["plugins"][0]["op"] == "rmsnorm" and d["dev_key"] is False and d["format_version"] == 1
    with pytest.raises(VerificationError, match=r"file: missing.*\(and 1 more failed checks\)") as e:
        r.raise_if_failed()
    assert e.value.file == "model.onnx"


def test_runner_for_root_is_given_the_bundle_root(bundle, tmp_path, public_key):
    roots = []

    def runner_for_root(root):
        roots.append(root)
        return run_reference

    assert verify_bundle(bundle, [public_key], runner_for_root=runner_for_root, local_arch=None).ok
    tar = write_archive(bundle, tmp_path / "b.tar")
    assert verify_bundle(tar, [public_key], runner_for_root=runner_for_root, local_arch=None).ok
    assert roots[0] == bundle and roots[1].name == "bundle" and not roots[1].exists()  # temp dir removed


def test_arch_older_than_the_target_is_reported(bundle, public_key):
    r = verify_bundle(bundle, [public_key], run_golden=None, local_arch=80)
    (c,) = [c for c in r.checks if c.check == "arch"]
    assert r.ok and c.status == "warn" and "plugins cannot run here" in c.reason


def test_local_arch_is_detected_when_not_given(bundle, public_key, monkeypatch):
    monkeypatch.setattr(verify_module, "detect_local_arch", lambda: 87)
    r = verify_bundle(bundle, [public_key], run_golden=None)
    assert [c.status for c in r.checks if c.check == "arch"] == ["pass"]


def test_attack_truncated_archive_is_refused_by_verify(bundle, tmp_path, public_key):
    tar = write_archive(bundle, tmp_path / "b.tar")
    data = tar.read_bytes()
    (tmp_path / "cut.tar").write_bytes(data[: data.index(b"stand-in onnx") + 5])  # inside a member's data
    r = verify_bundle(tmp_path / "cut.tar", [public_key], local_arch=None)
    (fail,) = r.failures
    assert fail.check == "archive" and ("not a readable tar archive" in fail.reason or "truncated" in fail.reason)


def test_a_single_failure_is_raised_without_a_count(bundle, public_key):
    os.remove(bundle / "model.onnx")
    r = verify_bundle(bundle, [public_key], run_golden=None, local_arch=None)
    with pytest.raises(VerificationError) as e:
        r.raise_if_failed()
    assert "more failed checks" not in str(e.value)


def test_attack_dev_key_manifest_is_refused_by_default_in_the_pure_checks(tmp_path):
    b = write_bundle(tmp_path / "b", development_key())
    with pytest.raises(VerificationError, match="public development key"):
        verify_manifest((b / "manifest.json").read_bytes(), (b / "manifest.sig").read_bytes(), [])
    files = {rel: (b / rel).read_bytes() for rel in list_tree(b)}
    assert _fails(verify_bundle_bytes(files, []))[0][:2] == ("signature", "manifest.sig")
    assert verify_bundle_bytes(files, [], allow_dev_key=True).ok


def test_the_first_disagreement_with_the_manifest_is_named(bundle, signing_key, public_key):
    meta = rmsnorm_metadata()
    meta["version"], meta["abi_version"] = 2, 2
    (bundle / "plugins/rmsnorm/1/plugin.json").write_bytes(canonical_json(meta))
    resign(bundle, signing_key)
    r = verify_bundle(bundle, [public_key], run_golden=None, local_arch=None)
    assert _fails(r) == [("plugin", "plugins/rmsnorm/1/plugin.json", "version 2 differs from the manifest's 1")]


def test_a_runner_returning_the_wrong_shape_is_a_failed_check_not_a_crash(bundle, public_key):
    def wrong_shape(op, inputs, attrs, plugin):
        return run_reference(op, inputs, attrs)[:1]

    r = verify_bundle(bundle, [public_key], run_golden=wrong_shape, local_arch=None)
    assert {f for _, f, _ in _fails(r)} == {"plugins/rmsnorm/1/golden.safetensors#t4", "golden/rmsnorm.safetensors#t4"}
    assert all("has shape" in reason for _, _, reason in _fails(r))


def test_only_safetensors_under_golden_are_golden_vectors(bundle, signing_key, public_key):
    (bundle / "golden/README.txt").write_bytes(b"how these vectors were made")
    resign(bundle, signing_key)
    r = verify_bundle(bundle, [public_key], local_arch=None)
    assert r.ok and not [c for c in r.checks if c.check == "golden" and "README" in c.file]


def test_local_arch_is_the_first_gpu_s_compute_capability(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: {0: (8, 7)}[index])
    assert verify_module.detect_local_arch() == 87
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (_ for _ in ()).throw(RuntimeError("no driver")))
    assert verify_module.detect_local_arch() is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert verify_module.detect_local_arch() is None


def test_checks_cannot_be_altered_after_the_fact(bundle, public_key):
    import dataclasses

    r = verify_bundle(bundle, [public_key], run_golden=None, local_arch=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.checks[0].status = "pass"
    v = verify_manifest((bundle / "manifest.json").read_bytes(), (bundle / "manifest.sig").read_bytes(), [public_key])
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.key_id = "x"
    assert r.checks[0].to_dict() == {"check": "signature", "file": "manifest.sig", "status": "pass",
                                     "reason": r.checks[0].reason}
