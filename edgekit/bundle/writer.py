"""BundleWriter: collect a bundle's files, hash them, sign the manifest, appear atomically.

Everything is written into a hidden sibling directory (``.NAME.partial-PID``);
each file is written to a temp name, fsynced and renamed; the manifest and its
signature come last; then the whole directory is renamed to its final name. A
crash at any point leaves either no bundle or the previous one, never a bundle
whose manifest does not match its files.

Deterministic: file contents are the caller's, JSON is written with sorted keys,
the manifest holds no timestamps or host paths, ed25519 signatures are
deterministic. Same inputs -> same bytes and hashes.

Typical use (the build command)::

    with BundleWriter(out_dir) as w:
        w.add_file("weights/model.safetensors", weights_path)
        w.add_json("plan.json", plan_dict)
        w.add_plugin(metadata, {"kernel.cubin": cubin, "kernel.ptx": ptx, "golden.safetensors": golden})
        manifest = w.finish(key=signing_key, target=..., model=..., plan=..., precision=..., buckets=...)
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Mapping, Optional

from edgekit.bundle.archive import is_bundle_archive
from edgekit.bundle.canonical import relpath_problem, sha256_hex
from edgekit.durable import fsync_dir
from edgekit.durable import replace_atomically as atomic_write_bytes
from edgekit.bundle.keys import SigningKey
from edgekit.bundle.manifest import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_FILE,
    PLUGIN_METADATA_FILE,
    RESERVED_FILES,
    SIGNATURE_FILE,
    SIGNED_PAIR,
    Buckets,
    FileEntry,
    Manifest,
    ModelIdentity,
    PluginRef,
    Target,
    plugin_dir,
)
from edgekit.bundle.plugin import PluginMetadata, parse_plugin_metadata
from edgekit.errors import BundleError
from edgekit.kernels.arch import arch_name

_COPY_CHUNK = 1 << 20


def pretty_json(obj: Any) -> bytes:
    """Human-readable but deterministic JSON for unsigned-but-hashed files (plan.json, ...)."""
    return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


def check_bundle_destination(out_dir: str | os.PathLike, *, overwrite: bool) -> Path:
    """The absolute path a bundle may be written to, or BundleError saying why not.

    ``overwrite`` (--force) replaces an earlier bundle, never anything else: the old directory is renamed aside and
    deleted once the new one is in place, so a --force aimed at a home directory or a source tree would delete it.
    What may be replaced: a directory holding a bundle's manifest and signature. An empty directory is taken without
    --force (nothing in it to lose). The current directory and its parents are refused outright (the rename cannot
    move them, and a bundle needs a name)."""
    given = Path(out_dir)
    path = Path(os.path.abspath(given))
    cwd = Path.cwd().resolve()
    if path.resolve() == cwd or path.resolve() in cwd.parents:
        raise BundleError(f"-o {given}: is the current directory or one of its parents; a bundle needs a directory "
                          "of its own", hint="pass a new directory name, e.g. -o bundle")
    if path.is_symlink():  # the rename would replace the link, not what it points to, and leave a dangling one
        raise BundleError(f"-o {given}: is a symbolic link (to {os.readlink(path)}); a bundle is written as a real "
                          "directory", hint="pass the directory it points to, or a new name (and re-point the link)")
    if not path.exists():
        return path
    if not path.is_dir():
        raise BundleError(f"{given} exists and is a file, not a bundle directory",
                          hint="choose another -o directory, or remove the file yourself")
    entries = {p.name for p in path.iterdir()}
    if not entries:
        return path  # made beforehand (`mkdir out`): nothing in it to lose, so no --force is asked for
    if not SIGNED_PAIR <= entries:
        shown = ", ".join(sorted(entries)[:3]) + (", ..." if len(entries) > 3 else "")
        raise BundleError(f"{given} exists and is not an edgekit bundle (no {MANIFEST_FILE} and {SIGNATURE_FILE}; "
                          f"it holds {shown}); --force replaces only an earlier bundle, so it is left as it is",
                          hint="choose another -o directory, or remove that directory yourself if it is not needed")
    if not overwrite:
        raise BundleError(f"{given} already exists", hint="choose another -o directory or pass --force to replace it")
    return path


def archive_path_of(out_dir: Path) -> Path:
    """Where `build --archive` writes the bundle as one file: beside it, its name + ".tar" (``-o m-v1.2`` gives
    m-v1.2.tar, not m-v1.tar, which another bundle's archive would share)."""
    return out_dir.with_name(out_dir.name + ".tar")


def check_archive_destination(tar: Path, *, overwrite: bool) -> None:
    """Refuse, before any work, an archive path that exists unless --force and it is an earlier bundle archive."""
    if not tar.exists() and not tar.is_symlink():
        return
    if not overwrite:
        raise BundleError(f"--archive: {tar} already exists", hint="choose another -o DIR or pass --force to replace it")
    if not tar.is_file() or tar.is_symlink() or not is_bundle_archive(tar):
        raise BundleError(f"--archive: {tar} exists and is not an edgekit bundle archive; --force replaces only an "
                          "earlier one, so it is left as it is", hint="choose another -o DIR, or remove that file yourself")


def _abandoned_staging(out_dir: Path) -> list[Path]:
    """The hidden staging folders (``.NAME.partial-PID``) of earlier builds of ``out_dir`` whose process is gone: a
    build killed without running its clean-up (SIGKILL, power loss) left them, and nothing else would remove them. A
    folder whose process still runs is another build at work and is left alone; one with this process's id is an
    earlier process's that had the same id."""
    prefix = f".{out_dir.name}.partial-"
    gone = []
    for p in out_dir.parent.glob(f"{prefix}*"):
        pid = p.name[len(prefix):]
        if (pid.isdigit() and p.is_dir() and not p.is_symlink()
                and (int(pid) == os.getpid() or not _process_alive(int(pid)))):
            gone.append(p)
    return gone


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _is_empty_directory(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and not any(path.iterdir())


class BundleWriter:
    def __init__(self, out_dir: str | os.PathLike, *, overwrite: bool = False):
        self.out_dir = check_bundle_destination(out_dir, overwrite=overwrite)
        self.overwrite = overwrite
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.out_dir.with_name(f".{self.out_dir.name}.partial-{os.getpid()}")
        for stale in _abandoned_staging(self.out_dir):
            # a killed build's (kill -9, power loss): never read, only disk; this process's own must go, or mkdir fails
            shutil.rmtree(stale, ignore_errors=stale != self._tmp)
        self._tmp.mkdir()
        self._files: dict[str, FileEntry] = {}
        self._plugins: list[PluginRef] = []
        self._done = False

    # -- context manager: an exception discards the partial bundle
    def __enter__(self) -> "BundleWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or not self._done:
            self.abort()

    def abort(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)

    @property
    def files(self) -> Mapping[str, FileEntry]:
        return dict(self._files)

    def _target(self, relpath: str) -> Path:
        problem = relpath_problem(relpath)
        if problem:
            raise BundleError(f"bundle path {relpath!r}: {problem}")
        if relpath in RESERVED_FILES:
            raise BundleError(f"{relpath} is written by the writer itself")
        if relpath in self._files:
            raise BundleError(f"{relpath} was already added to the bundle")
        dirs = {"/".join(p.split("/")[:i]) for p in [*self._files, relpath] for i in range(1, p.count("/") + 1)}
        if relpath in dirs or any(d in self._files for d in dirs):
            raise BundleError(f"{relpath} clashes with another entry (a path cannot be both a file and a directory)")
        dest = self._tmp / relpath
        dest.parent.mkdir(parents=True, exist_ok=True)
        return dest

    def add_bytes(self, relpath: str, data: bytes) -> FileEntry:
        dest = self._target(relpath)
        atomic_write_bytes(dest, data)
        entry = FileEntry(sha256=sha256_hex(data), size=len(data))
        self._files[relpath] = entry
        return entry

    def add_json(self, relpath: str, obj: Any) -> FileEntry:
        return self.add_bytes(relpath, pretty_json(obj))

    def add_file(self, relpath: str, src: str | os.PathLike) -> FileEntry:
        """Copy a (possibly large) file in chunks, hashing while copying."""
        import hashlib

        dest = self._target(relpath)
        tmp = dest.with_name(f".{dest.name}.tmp")
        h, size = hashlib.sha256(), 0
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            while chunk := fin.read(_COPY_CHUNK):
                h.update(chunk)
                size += len(chunk)
                fout.write(chunk)
            fout.flush()
            os.fsync(fout.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
        entry = FileEntry(sha256=h.hexdigest(), size=size)
        self._files[relpath] = entry
        return entry

    def add_tree(self, relprefix: str, src_dir: str | os.PathLike) -> dict[str, FileEntry]:
        """Every regular file under src_dir (e.g. a tokenizer directory), under relprefix/, in sorted order.

        Refuses symbolic links: a bundle holds the bytes, never a pointer to somewhere else.
        """
        from edgekit.bundle.archive import list_tree

        return {f"{relprefix}/{rel}": self.add_file(f"{relprefix}/{rel}", Path(src_dir) / rel) for rel in list_tree(src_dir)}

    def add_plugin(self, metadata: PluginMetadata, files: Mapping[str, bytes]) -> PluginRef:
        """plugins/<op>/<version>/: plugin.json (canonical, from metadata) + kernels + golden.safetensors."""
        content = dict(files)
        given = content.pop(PLUGIN_METADATA_FILE, None)
        if given is not None and parse_plugin_metadata(given) != metadata:
            raise BundleError(f"plugin {metadata.op}: the given plugin.json differs from the metadata object")
        expected = set(metadata.file_names()) - {PLUGIN_METADATA_FILE}
        if set(content) != expected:
            raise BundleError(
                f"plugin {metadata.op} v{metadata.version}: files {sorted(content)} do not match its metadata, which needs {sorted(expected)}"
            )
        ref = PluginRef(op=metadata.op, version=metadata.version, abi_version=metadata.abi_version, path=plugin_dir(metadata.op, metadata.version))
        if any((p.op, p.version) == (ref.op, ref.version) for p in self._plugins):
            raise BundleError(f"plugin {ref.op} v{ref.version} was already added")
        self.add_bytes(f"{ref.path}/{PLUGIN_METADATA_FILE}", given if given is not None else metadata.to_bytes())
        for name in sorted(content):
            self.add_bytes(f"{ref.path}/{name}", content[name])
        self._plugins.append(ref)
        return ref

    def finish(
        self,
        *,
        key: SigningKey,
        target: Target,
        model: ModelIdentity,
        plan: Mapping[str, Any],
        precision: Mapping[str, str],
        buckets: Buckets,
        triton_version: Optional[str] = None,
        edgekit_version: Optional[str] = None,
        created_by: Optional[str] = None,
    ) -> Manifest:
        """Write manifest.json + manifest.sig and move the bundle into place. Returns the manifest."""
        from edgekit import __version__

        if triton_version is None:
            import triton

            triton_version = triton.__version__
        edgekit_version = edgekit_version or __version__
        manifest = Manifest(
            format=FORMAT_NAME,
            format_version=FORMAT_VERSION,
            edgekit_version=edgekit_version,
            triton_version=triton_version,
            target=target,
            model=model,
            plan=dict(plan),
            precision=dict(precision),
            buckets=buckets,
            files=dict(sorted(self._files.items())),
            plugins=list(sorted(self._plugins, key=lambda p: (p.op, p.version))),
            created_by=created_by or f"edgekit {edgekit_version}",
            dev_key=key.is_dev,
        )
        for p in manifest.plugins:
            meta = parse_plugin_metadata((self._tmp / p.path / PLUGIN_METADATA_FILE).read_bytes())
            if meta.arch != target.arch:
                raise BundleError(f"plugin {p.op} v{p.version} is compiled for {arch_name(meta.arch)}; the bundle targets {arch_name(target.arch)}")
        manifest_bytes = manifest.to_bytes()
        atomic_write_bytes(self._tmp / MANIFEST_FILE, manifest_bytes)
        atomic_write_bytes(self._tmp / SIGNATURE_FILE, key.sign(manifest_bytes))
        for dirpath, _, _ in os.walk(self._tmp):
            fsync_dir(dirpath)
        self._move_into_place()
        self._done = True
        return manifest

    def _move_into_place(self) -> None:
        old = None
        if self.out_dir.exists():
            if not self.overwrite and not _is_empty_directory(self.out_dir):
                raise BundleError(f"{self.out_dir} appeared while building", hint="pass --force to replace it")
            check_bundle_destination(self.out_dir, overwrite=True)  # it may have changed while we built
            old = self.out_dir.with_name(f".{self.out_dir.name}.old-{os.getpid()}")
            if old.exists():
                shutil.rmtree(old)
            os.rename(self.out_dir, old)
        os.rename(self._tmp, self.out_dir)
        fsync_dir(self.out_dir.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
