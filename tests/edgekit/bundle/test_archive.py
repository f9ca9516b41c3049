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


def test_extract_only_writes_the_named_members(tmp_path):
    write_archive(_tree(tmp_path / "src", FILES), tmp_path / "x.tar")
    out = safe_extract(tmp_path / "x.tar", tmp_path / "dest", only={"weights/w.safetensors", "not/in/the/archive"})
    assert list_tree(out) == ["weights/w.safetensors"] and (out / "weights/w.safetensors").read_bytes() == b"w" * 5000
    dotted = _evil_tar(tmp_path / "dotted.tar", [("./manifest.json", tarfile.REGTYPE, b"{}", ""),
                                                 ("./weights/w.safetensors", tarfile.REGTYPE, b"w", "")])
    assert list_tree(safe_extract(dotted, tmp_path / "d2", only={"manifest.json"})) == ["manifest.json"]
    # one name as a plain string would be matched by its characters ("weights" in "weights/w.safetensors"): refused
    with pytest.raises(TypeError, match="collection of member names"):
        safe_extract(tmp_path / "x.tar", tmp_path / "d3", only="weights/w.safetensors")
    assert not (tmp_path / "d3").exists()


def test_attack_an_unsafe_member_refuses_the_archive_even_when_only_others_are_asked_for(tmp_path):
    evil = _evil_tar(tmp_path / "evil.tar", [OK, ("plugins/x/kernel.cubin", tarfile.SYMTYPE, b"", "/etc/shadow")])
    with pytest.raises(VerificationError, match="symbolic link"):
        safe_extract(evil, tmp_path / "dest", only={"manifest.json"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.tar"]


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
    with pytest.raises(VerificationError, match="not a readable tar") as e:
        safe_extract(tmp_path / "junk.tar", tmp_path / "dest")
    # one line (tarfile lists every compression it tried, one a line) and what a bundle is, for a model file given
    assert "\n" not in str(e.value) and "edgekit generate" in e.value.hint
    (problem,) = inspect_archive(tmp_path / "junk.tar")  # verify's report: the same one line
    assert "\n" not in problem.reason and "edgekit generate" in problem.reason


def test_a_cut_short_compressed_bundle_is_a_damaged_archive_not_an_abort(tmp_path):
    """A .tar.gz cut short raised gzip's EOFError, which the CLI took for Ctrl-C ("Aborted", exit 130)."""
    import gzip

    src = tmp_path / "b.tar"
    with tarfile.open(src, "w") as tf:
        info = tarfile.TarInfo("manifest.json")
        data = os.urandom(200_000)
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    whole = gzip.compress(src.read_bytes())
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(VerificationError, match="damaged or truncated archive") as e:
        safe_extract(cut, tmp_path / "dest")
    assert "copy it again" in e.value.hint and not (tmp_path / "dest").exists()
    assert any("damaged or truncated" in p.reason for p in inspect_archive(cut))
    # the whole archive is at fault: named once ('cut.tar.gz:cut.tar.gz' in verify's and info's reports before)
    assert [p.where(cut.name) for p in inspect_archive(cut)] == ["cut.tar.gz"]
    from edgekit.bundle.verify import verify_bundle

    report = verify_bundle(cut, [], allow_dev_key=True)
    assert [(c.check, c.file) for c in report.checks] == [("archive", "cut.tar.gz")], report.checks


def test_list_tree_refuses_symlinks(tmp_path):
    _tree(tmp_path, {"a": b"1"})
    os.symlink("/etc/passwd", tmp_path / "link")
    with pytest.raises(VerificationError, match="symbolic link"):
        list_tree(tmp_path)


# ---- issue 19: limits at their edge, truncation, members that are not files -----------------------------------------

from edgekit.bundle.archive import _copy_exact, read_tar_bytes, scan_members, tar_bytes  # noqa: E402


def _infos(*sizes, names=None):
    out = []
    for i, size in enumerate(sizes):
        info = tarfile.TarInfo(names[i] if names else f"f{i}")
        info.size = size
        out.append(info)
    return out


def test_member_count_limit_holds_at_its_edge():
    files, problems = scan_members(_infos(*[1] * 5), max_members=5)
    assert len(files) == 5 and problems == []
    files, problems = scan_members(_infos(*[1] * 6), max_members=5)
    assert [p.reason for p in problems] == ["more than 5 members"] and problems[0].member == "f5"


def test_total_size_limit_holds_at_its_edge():
    files, problems = scan_members(_infos(600, 400), max_total_bytes=1000)
    assert len(files) == 2 and problems == []
    files, problems = scan_members(_infos(600, 401), max_total_bytes=1000)
    assert [(p.member, p.reason) for p in problems] == [("f1", "archive expands to more than 1000 bytes")]


def test_package_reader_limits_hold_at_their_edges():
    files = {f"m{i:02}": b"x" for i in range(64)}
    assert len(read_tar_bytes(tar_bytes(files))) == 64  # a plugin package may have 64 members
    with pytest.raises(VerificationError, match="more than 64 members"):
        read_tar_bytes(tar_bytes({**files, "one_more": b"x"}))
    assert read_tar_bytes(tar_bytes({"a": b"x" * 10}), max_total_bytes=10) == {"a": b"x" * 10}
    with pytest.raises(VerificationError, match="expands to more than 9 bytes"):
        read_tar_bytes(tar_bytes({"a": b"x" * 10}), max_total_bytes=9)


def test_package_reader_is_flat_unless_told_otherwise():
    data = tar_bytes({"sub/a": b"1", "b": b"2"})
    with pytest.raises(VerificationError, match="plain file names"):
        read_tar_bytes(data)
    assert read_tar_bytes(data, flat=False) == {"sub/a": b"1", "b": b"2"}


def test_directory_members_and_dot_slash_prefixes_are_harmless_in_a_bundle_archive(tmp_path):
    path = tmp_path / "dirs.tar"
    with tarfile.open(path, "w") as tf:
        for name in (".", "./weights", "./weights/"):
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            tf.addfile(info)
        info = tarfile.TarInfo("./weights/w.bin")
        info.size = 3
        tf.addfile(info, io.BytesIO(b"abc"))
    assert inspect_archive(path) == []
    out = safe_extract(path, tmp_path / "dest")
    assert list_tree(out) == ["weights/w.bin"] and (out / "weights/w.bin").read_bytes() == b"abc"


def test_attack_directory_member_in_a_plugin_package_is_refused():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("sub")
        info.type = tarfile.DIRTYPE
        tf.addfile(info)
    with pytest.raises(VerificationError, match="directories are not allowed in a plugin package"):
        read_tar_bytes(buf.getvalue())


@pytest.mark.parametrize("name, reason", [
    ("a\\b", "backslash"), ("weights/./w", "'.' path component"), ("-rf", "starts with '.' or '-'"),
    ("C:/evil", "absolute path"), ("/".join("d" * 9), "more than 8 path components"), ("x" * 256, "longer than 255"),
])
def test_attack_odd_member_names_are_refused(tmp_path, name, reason):
    evil = _evil_tar(tmp_path / "evil.tar", [OK, (name, tarfile.REGTYPE, b"x", "")])
    assert any(reason in p.reason for p in inspect_archive(evil)), inspect_archive(evil)


def test_attack_unknown_member_type_is_refused(tmp_path):
    evil = _evil_tar(tmp_path / "evil.tar", [OK, ("weird", b"Z", b"", "")])
    assert [p.reason for p in inspect_archive(evil)] == ["member type b'Z' is not a regular file"]


def test_all_problems_are_reported_and_the_first_is_raised(tmp_path):
    evil = _evil_tar(tmp_path / "evil.tar", [OK, ("../a", tarfile.REGTYPE, b"x", ""), ("/b", tarfile.REGTYPE, b"x", "")])
    assert len(inspect_archive(evil)) == 2
    with pytest.raises(VerificationError, match=r"'\.\.' component .*\(and 1 more problems\)"):
        safe_extract(evil, tmp_path / "dest")


def test_attack_truncated_member_stops_with_an_error_instead_of_looping():
    """A member whose data ends early (a cut download): the copy must stop, not spin on empty reads."""
    class EndsEarly(io.BytesIO):
        empty_reads = 0

        def read(self, n=-1):
            chunk = super().read(n)
            self.empty_reads += not chunk
            assert self.empty_reads < 100, "kept reading past the end of the data"  # a hang, made a failure
            return chunk

    with pytest.raises(VerificationError, match="ends 90 bytes early \\(truncated\\)"):
        _copy_exact(EndsEarly(b"x" * 10), io.BytesIO(), 100)
    _copy_exact(io.BytesIO(b"y" * 10), dst := io.BytesIO(), 10)
    assert dst.getvalue() == b"y" * 10


def test_attack_truncated_archive_is_refused_and_nothing_extracted(tmp_path):
    write_archive(_tree(tmp_path / "src", FILES), tmp_path / "x.tar")
    data = (tmp_path / "x.tar").read_bytes()
    cut = data.index(b"w" * 100) + 2000  # inside the weights member's data
    (tmp_path / "cut.tar").write_bytes(data[:cut])
    with pytest.raises(VerificationError, match="not a readable tar archive|truncated"):
        safe_extract(tmp_path / "cut.tar", tmp_path / "dest")
    assert not (tmp_path / "dest").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.tar", "src", "x.tar"]  # no temp dir left


def test_attack_fifo_inside_a_bundle_directory_is_refused_without_opening_it(tmp_path):
    _tree(tmp_path, {"a": b"1"})
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(VerificationError, match="not a regular file"):
        list_tree(tmp_path)
    with pytest.raises(VerificationError, match="not a regular file"):
        write_archive(tmp_path, tmp_path.parent / f"{tmp_path.name}.tar")


def test_attack_symlinked_directory_inside_a_bundle_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "dirlink")
    with pytest.raises(VerificationError, match="dirlink.*symbolic link|symbolic link"):
        list_tree(tmp_path)


def test_archive_writer_refuses_names_that_could_not_be_extracted_safely():
    with pytest.raises(BundleError, match="cannot archive '../x'"):
        tar_bytes({"../x": b"1"})


def test_archive_may_be_replaced_on_request(tmp_path):
    write_archive(_tree(tmp_path / "src", FILES), tmp_path / "x.tar")
    (tmp_path / "src" / "extra").write_bytes(b"e")
    write_archive(tmp_path / "src", tmp_path / "x.tar", overwrite=True)
    with tarfile.open(tmp_path / "x.tar") as tf:
        assert "extra" in tf.getnames()


def test_a_single_problem_is_raised_without_a_count(tmp_path):
    evil = _evil_tar(tmp_path / "evil.tar", [OK, ("../a", tarfile.REGTYPE, b"x", "")])
    with pytest.raises(VerificationError) as e:
        safe_extract(evil, tmp_path / "dest")
    assert "more problems" not in str(e.value)


def test_archive_writer_failing_midway_raises_and_leaves_no_file(tmp_path):
    _tree(tmp_path / "src", {"ok.bin": b"1", "bad name.bin": b"2"})  # a name no archive may carry
    with pytest.raises(BundleError, match="cannot archive 'bad name.bin'"):
        write_archive(tmp_path / "src", tmp_path / "x.tar")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_extracted_tree_has_fixed_modes(tmp_path):
    write_archive(_tree(tmp_path / "src", FILES), tmp_path / "x.tar")
    old = os.umask(0o022)
    try:
        out = safe_extract(tmp_path / "x.tar", tmp_path / "dest")
    finally:
        os.umask(old)
    assert os.stat(out).st_mode & 0o777 == 0o755
    assert {os.stat(out / rel).st_mode & 0o777 for rel in FILES} == {0o644}


def test_member_problems_cannot_be_altered():
    import dataclasses

    _, (problem,) = scan_members(_infos(2, names=["../x"]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        problem.reason = "fine"
