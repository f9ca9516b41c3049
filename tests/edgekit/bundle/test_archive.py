"""Archives: deterministic writing; extraction refuses path tricks, links, devices, duplicates, bombs."""

from __future__ import annotations

import io
import os
import tarfile
import time

import pytest

from edgekit.bundle.archive import inspect_archive, list_tree, safe_extract, write_archive
from edgekit.errors import BundleError, VerificationError


def _tree(root, files):
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


FILES = {"manifest.json": b"{}", "plugins/rmsnorm/1/kernel.cubin": b"\x7fELF", "weights/w.safetensors": b"w" * 5000}


def test_archive_is_deterministic_across_mtimes_and_modes(tmp_path):
    a = _tree(tmp_path / "a", FILES)
    write_archive(a, tmp_path / "a.tar")
    time.sleep(0.01)
    b = _tree(tmp_path / "b", dict(reversed(list(FILES.items()))))
    os.chmod(b / "manifest.json", 0o600)
    os.utime(b / "weights/w.safetensors", (1, 1))
    write_archive(b, tmp_path / "b.tar")
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    with tarfile.open(tmp_path / "a.tar") as tf:
        members = tf.getmembers()
    assert [m.name for m in members] == sorted(FILES)
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.mode == 0o644 and m.isreg() for m in members)


def test_round_trip_extract(tmp_path):
    write_archive(_tree(tmp_path / "src", FILES), tmp_path / "x.tar")
    out = safe_extract(tmp_path / "x.tar", tmp_path / "dest")
    assert {r: (out / r).read_bytes() for r in list_tree(out)} == FILES
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".dest")]  # no temp dir left


def test_refuses_to_overwrite(tmp_path):
    write_archive(_tree(tmp_path / "src", FILES), tmp_path / "x.tar")
    with pytest.raises(BundleError, match="already exists"):
        write_archive(tmp_path / "src", tmp_path / "x.tar")
    (tmp_path / "dest").mkdir()
    with pytest.raises(BundleError, match="already exists"):
        safe_extract(tmp_path / "x.tar", tmp_path / "dest")


def _evil_tar(path, entries):
    with tarfile.open(path, "w") as tf:
        for name, kind, data, link in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = link
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            tf.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return path


OK = ("manifest.json", tarfile.REGTYPE, b"{}", "")


@pytest.mark.parametrize(
    "entry, reason",
    [
        (("../escape.txt", tarfile.REGTYPE, b"x", ""), "'..'"),
        (("weights/../../escape.txt", tarfile.REGTYPE, b"x", ""), "'..'"),
        (("/etc/cron.d/evil", tarfile.REGTYPE, b"x", ""), "absolute path"),
        (("weights/model.safetensors", tarfile.SYMTYPE, b"", "/etc/shadow"), "symbolic link"),
        (("weights/model.safetensors", tarfile.LNKTYPE, b"", "manifest.json"), "hard link"),
        (("dev/sda", tarfile.BLKTYPE, b"", ""), "device file"),
        (("dev/tty", tarfile.CHRTYPE, b"", ""), "device file"),
        (("pipe", tarfile.FIFOTYPE, b"", ""), "FIFO"),
        (("manifest.json", tarfile.REGTYPE, b"{replaced}", ""), "duplicate member"),
        (("manifest.json/inner", tarfile.REGTYPE, b"x", ""), "used both as a file and as a directory"),
    ],
)
def test_attack_unsafe_archive_member_is_refused_and_nothing_extracted(tmp_path, entry, reason):
    evil = _evil_tar(tmp_path / "evil.tar", [OK, entry])
    problems = inspect_archive(evil)
    assert any(reason in p.reason for p in problems), problems
    with pytest.raises(VerificationError, match=reason) as e:
        safe_extract(evil, tmp_path / "dest")
    assert "evil.tar:" in e.value.file
    assert not (tmp_path / "dest").exists()
    assert not (tmp_path / "escape.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.tar"]


def test_attack_decompression_bomb_by_declared_sizes_is_refused(tmp_path):
    evil = _evil_tar(tmp_path / "big.tar", [OK, ("w.bin", tarfile.REGTYPE, b"x" * 4096, "")])
    with pytest.raises(VerificationError, match="expands to more than 1000 bytes"):
        safe_extract(evil, tmp_path / "dest", max_total_bytes=1000)
    assert not (tmp_path / "dest").exists()


def test_attack_not_a_tar(tmp_path):
    (tmp_path / "junk.tar").write_bytes(b"\x00\x01junk" * 300)
    assert inspect_archive(tmp_path / "junk.tar")
    with pytest.raises(VerificationError, match="not a readable tar"):
        safe_extract(tmp_path / "junk.tar", tmp_path / "dest")


def test_list_tree_refuses_symlinks(tmp_path):
    _tree(tmp_path, {"a": b"1"})
    os.symlink("/etc/passwd", tmp_path / "link")
    with pytest.raises(VerificationError, match="symbolic link"):
        list_tree(tmp_path)
