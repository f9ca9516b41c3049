"""Single-file tar archives: deterministic writing, and reading that refuses tricks.

Writing: members sorted by name, regular files only (directories are implied),
mtime 0, uid/gid 0, empty owner names, mode 0644, PAX format. The same bundle
directory always gives the same archive bytes.

Reading an archive from elsewhere (a bundle copied to a device, a plugin
package uploaded over the air) refuses, before a single byte is written:
absolute paths, `..` components, symlinks, hard links, devices, FIFOs,
duplicate names (a later member would silently replace the one that was
checked), a name used both as file and directory, too many members, and
totals beyond a limit. Extraction goes into a temporary sibling directory that
is renamed into place only when complete, so a crash leaves no half bundle.
"""

from __future__ import annotations

import gzip
import io
import lzma
import os
import re
import shutil
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Collection, Iterable, Mapping

from edgekit.bundle.canonical import relpath_problem
from edgekit.durable import fsync_dir
from edgekit.errors import BundleError, VerificationError

FILE_MODE = 0o644
MAX_MEMBERS = 100_000
DEFAULT_MAX_TOTAL_BYTES = 64 << 30  # bundles of 3B-parameter models are a few GiB; 64 GiB is clearly not one
_COPY_CHUNK = 1 << 20


# ---- writing ---------------------------------------------------------------


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = FILE_MODE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info


def _check_member_name(name: str) -> None:
    problem = relpath_problem(name)
    if problem:
        raise BundleError(f"cannot archive {name!r}: {problem}")


def tar_bytes(files: Mapping[str, bytes]) -> bytes:
    """An in-memory deterministic tar of {name: bytes} (plugin packages)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name in sorted(files):
            _check_member_name(name)
            data = files[name]
            tf.addfile(_tarinfo(name, len(data)), io.BytesIO(data))
    return buf.getvalue()


def list_tree(root: str | os.PathLike) -> list[str]:
    """Relative POSIX paths of the regular files under root, sorted; refuses links and special files."""
    root = Path(root)
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if full.is_symlink():
                raise VerificationError(rel, "is a symbolic link; bundles hold regular files only")
            if name in filenames and not full.is_file():
                raise VerificationError(rel, "is not a regular file (device, FIFO or socket)")
            if name in filenames:
                out.append(rel)
    return sorted(out)


def write_archive(bundle_dir: str | os.PathLike, out_path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write bundle_dir as one deterministic .tar (temp file, fsync, rename)."""
    bundle_dir, out_path = Path(bundle_dir), Path(out_path)
    if out_path.exists() and not overwrite:
        raise BundleError(f"{out_path} already exists", hint="remove it or pass --force")
    names = list_tree(bundle_dir)
    tmp = out_path.with_name(f".{out_path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tf:
                for name in names:
                    _check_member_name(name)
                    src = bundle_dir / name
                    with open(src, "rb") as data:
                        tf.addfile(_tarinfo(name, os.fstat(data.fileno()).st_size), data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(out_path.parent)
    return out_path


# ---- reading ---------------------------------------------------------------


@dataclass(frozen=True)
class MemberProblem:
    member: str  # "" for the archive as a whole (unreadable, truncated)
    reason: str

    def where(self, archive: str) -> str:
        """``archive:member``, or ``archive`` alone where the whole archive is at fault (it was 'cut.tar:cut.tar')."""
        return f"{archive}:{self.member}" if self.member else archive


def _member_name(info: tarfile.TarInfo) -> str:
    name = info.name
    # `tar -C dir .` writes "./x"; that prefix is harmless and purely textual.
    while name.startswith("./"):
        name = name[2:]
    return name.rstrip("/") if info.isdir() else name


def is_bundle_archive(path: str | os.PathLike) -> bool:
    """A readable tar whose members include a bundle's manifest and signature (not verified: verify does that)."""
    from edgekit.bundle.manifest import SIGNED_PAIR

    try:
        with tarfile.open(path) as tf:
            names = {_member_name(info) for info in tf.getmembers()}
    except (tarfile.TarError, OSError):
        return False
    return SIGNED_PAIR <= names


def scan_members(
    members: Iterable[tarfile.TarInfo], *, max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES, max_members: int = MAX_MEMBERS, flat: bool = False
) -> tuple[list[tarfile.TarInfo], list[MemberProblem]]:
    """Split an archive's members into safe regular files and problems. Pure (headers only).

    flat=True (plugin packages): every member must be a plain file name, no directories.
    """
    problems: list[MemberProblem] = []
    files: list[tarfile.TarInfo] = []
    seen: set[str] = set()
    dirs_used: set[str] = set()
    total = 0
    for i, info in enumerate(members):
        if i >= max_members:
            problems.append(MemberProblem(info.name, f"more than {max_members} members"))
            break
        raw = info.name
        if info.issym():
            problems.append(MemberProblem(raw, f"symbolic link (to {info.linkname!r}) is not allowed"))
            continue
        if info.islnk():
            problems.append(MemberProblem(raw, f"hard link (to {info.linkname!r}) is not allowed"))
            continue
        if info.ischr() or info.isblk():
            problems.append(MemberProblem(raw, "device file is not allowed"))
            continue
        if info.isfifo():
            problems.append(MemberProblem(raw, "FIFO is not allowed"))
            continue
        if not (info.isreg() or info.isdir()):
            problems.append(MemberProblem(raw, f"member type {info.type!r} is not a regular file"))
            continue
        name = _member_name(info)
        if info.isdir() and name in ("", "."):
            continue  # the archive root itself
        if raw.startswith("/"):
            problems.append(MemberProblem(raw, "absolute path is not allowed"))
            continue
        problem = relpath_problem(name)
        if problem:
            problems.append(MemberProblem(raw, problem))
            continue
        if info.isdir():
            if flat:
                problems.append(MemberProblem(raw, "directories are not allowed in a plugin package"))
            dirs_used.add(name)
            continue
        if flat and "/" in name:
            problems.append(MemberProblem(raw, "plugin package members must be plain file names"))
            continue
        if name in seen:
            problems.append(MemberProblem(raw, "duplicate member name (a second copy would replace the first)"))
            continue
        seen.add(name)
        parts = name.split("/")
        dirs_used.update("/".join(parts[:k]) for k in range(1, len(parts)))
        total += info.size
        if total > max_total_bytes:
            problems.append(MemberProblem(raw, f"archive expands to more than {max_total_bytes} bytes"))
            break
        files.append(info)
    for clash in sorted(seen & dirs_used):
        problems.append(MemberProblem(clash, "used both as a file and as a directory"))
    return files, problems


def _raise_first(problems: list[MemberProblem], archive: str) -> None:
    if problems:
        p = problems[0]
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise VerificationError(p.where(archive), f"{p.reason}{more}", hint="nothing was extracted")


def read_tar_bytes(
    data: bytes, *, name: str = "archive", max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES, max_members: int = 64, flat: bool = True
) -> dict[str, bytes]:
    """{member name: bytes} of an in-memory tar, after the same safety scan. Pure; no file is written."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
            files, problems = scan_members(tf.getmembers(), max_total_bytes=max_total_bytes, max_members=max_members, flat=flat)
            _raise_first(problems, name)
            out = {}
            for info in files:
                f = tf.extractfile(info)
                assert f is not None  # regular files always have data
                out[_member_name(info)] = f.read(info.size)
            return out
    except tarfile.TarError as e:
        raise VerificationError(name, f"not a readable tar archive ({e})") from e


NOT_A_BUNDLE_HINT = ("a bundle is the folder or .tar that `edgekit build` writes; a model file (.gguf, a Hugging Face "
                     "folder) runs with `edgekit generate MODEL`, or builds into a bundle with `edgekit build MODEL`")
DAMAGED_HINT = "the archive is damaged or cut short: copy it again (its sha256 should match the source's)"
# What reading a tar can raise besides TarError when its bytes are damaged: a cut-short gzip stream is an EOFError
# (which the CLI took for Ctrl-C: "Aborted", exit 130), damaged compressed bytes zlib / lzma / gzip errors
ARCHIVE_READ_ERRORS = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile)


def unreadable_archive(name: str, e: BaseException, opened: bool) -> VerificationError:
    """The one-line error for an archive tarfile could not read: not a tar at all (``opened`` False: tarfile.open
    failed; "r:*" lists every compression it tried, one a line, of which the plain tar's says why), or a tar
    damaged inside."""
    if not opened:
        lines = str(e).splitlines()
        why = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("- method tar:")),
                   lines[0].rstrip(":") if lines else type(e).__name__)
        why = re.sub(r"^\w+\('(.*)'\)$", r"\1", why)  # "ReadError('truncated header')" -> "truncated header"
        return VerificationError(name, f"not a readable tar archive ({why})", hint=NOT_A_BUNDLE_HINT)
    first = (str(e).splitlines() or [""])[0]
    return VerificationError(name, f"damaged or truncated archive ({type(e).__name__}: {first})", hint=DAMAGED_HINT)


def inspect_archive(archive: str | os.PathLike, *, max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES) -> list[MemberProblem]:
    """Every problem in an archive's headers (for reports); [] means it is safe to extract."""
    opened = False
    try:
        with tarfile.open(archive, mode="r:*") as tf:
            opened = True
            return scan_members(tf.getmembers(), max_total_bytes=max_total_bytes)[1]
    except (*ARCHIVE_READ_ERRORS, OSError) as e:
        err = unreadable_archive(Path(archive).name, e, opened)
        return [MemberProblem("", f"{err.reason} ({err.hint})")]


def safe_extract(archive: str | os.PathLike, dest: str | os.PathLike, *, max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
                 only: Collection[str] | None = None) -> Path:
    """Extract an archive to dest (which must not exist) after refusing every unsafe member.

    Files are written by this code (not tarfile.extract) with O_EXCL|O_NOFOLLOW and
    mode 0644; the tree appears at dest by one rename when it is complete.
    ``only``: write just these members (names as the reader reads them: "./weights/x" is "weights/x"); every member
    is still checked first, so an archive with one unsafe member is refused whatever is asked of it.
    """
    archive, dest = Path(archive), Path(dest)
    if isinstance(only, (str, bytes)):  # a lone name would be read as its characters: "in" became a substring test
        raise TypeError(f"safe_extract(only=...) takes a collection of member names, got the string {only!r}; "
                        f"pass {{{only!r}}}")
    only = None if only is None else frozenset(only)
    if dest.exists():
        raise BundleError(f"cannot extract to {dest}: it already exists", hint="choose a new directory")
    tmp = dest.with_name(f".{dest.name}.extract-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    opened = False
    try:
        with tarfile.open(archive, mode="r:*") as tf:
            opened = True
            files, problems = scan_members(tf.getmembers(), max_total_bytes=max_total_bytes)
            _raise_first(problems, archive.name)
            tmp.mkdir(mode=0o755)
            for info in files:
                if only is None or _member_name(info) in only:
                    _extract_one(tf, info, tmp)
    except ARCHIVE_READ_ERRORS as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise unreadable_archive(archive.name, e, opened) from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for dirpath, _, _ in os.walk(tmp):
        fsync_dir(dirpath)
    os.rename(tmp, dest)
    fsync_dir(dest.parent)
    return dest


def _extract_one(tf: tarfile.TarFile, info: tarfile.TarInfo, root: Path) -> None:
    name = _member_name(info)
    target = root / name
    target.parent.mkdir(parents=True, exist_ok=True)
    src = tf.extractfile(info)
    assert src is not None
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)
    with os.fdopen(fd, "wb") as out:
        _copy_exact(src, out, info.size)
        out.flush()
        os.fsync(out.fileno())


def _copy_exact(src: BinaryIO, dst: BinaryIO, size: int) -> None:
    left = size
    while left:
        chunk = src.read(min(_COPY_CHUNK, left))
        if not chunk:
            raise VerificationError(getattr(src, "name", "member"), f"archive ends {left} bytes early (truncated)")
        dst.write(chunk)
        left -= len(chunk)
