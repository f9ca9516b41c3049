"""Bundle verification: pure checks over bytes and keys, and a thin I/O layer over a path.

The pure layer (`verify_manifest`, `check_files`, `check_plugins`, `check_arch`,
`check_golden_file`, `verify_bundle_bytes`) never touches the file system: it
takes bytes, digests and keys and returns verdicts. `verify_bundle(path, ...)`
reads a directory or a .tar archive (extracted safely to a temporary
directory), hashes files in a streaming fashion and feeds the pure layer.

Order matters: nothing in a bundle is believed before the manifest's signature
by a trusted key checks out; no plugin.json or golden file is parsed before its
hash matches the signed manifest.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Literal, Mapping, Optional

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edgekit.bundle.archive import inspect_archive, list_tree, safe_extract
from edgekit.bundle.canonical import sha256_file, sha256_hex
from edgekit.bundle.golden import GoldenRunner, check_case, read_golden, run_reference
from edgekit.bundle.keys import DEV_KEY_ID, TrustedKeys, development_key, trust, verify_signature
from edgekit.bundle.manifest import (
    MANIFEST_FILE,
    PLUGIN_GOLDEN_FILE,
    PLUGIN_METADATA_FILE,
    RESERVED_FILES,
    SIGNATURE_FILE,
    Manifest,
    parse_manifest,
)
from edgekit.bundle.plugin import check_kernel_files, check_operator_compat, parse_plugin_metadata
from edgekit.errors import EdgekitError, VerificationError
from edgekit.kernels.arch import arch_name, arch_of_capability

Status = Literal["pass", "fail", "warn", "skip"]
Keys = Iterable[Ed25519PublicKey] | TrustedKeys
Observed = Mapping[str, tuple[str, int]]  # path -> (sha256, size) of what is really there


@dataclass(frozen=True)
class Check:
    check: str  # signature | manifest | file | plugin | arch | golden | archive
    file: str
    status: Status
    reason: str

    def to_dict(self) -> dict:
        return {"check": self.check, "file": self.file, "status": self.status, "reason": self.reason}


@dataclass
class VerificationReport:
    bundle: str
    checks: list[Check] = field(default_factory=list)
    manifest: Optional[Manifest] = None
    key_id: Optional[str] = None

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    def to_dict(self) -> dict:
        m = self.manifest
        return {
            "bundle": self.bundle,
            "ok": self.ok,
            "key_id": self.key_id,
            "dev_key": None if m is None else m.dev_key,
            # "sm_87", as build, plan, targets and plugin list write an arch (the manifest itself stores 87)
            "target": None if m is None else {"name": m.target.name, "arch": m.target.arch_name},
            "model": None if m is None else m.model.model_dump(),
            "format_version": None if m is None else m.format_version,
            "plugins": [] if m is None else [p.model_dump() for p in m.plugins],
            "checks": [c.to_dict() for c in self.checks],
            "failures": len(self.failures),
        }

    def raise_if_failed(self) -> None:
        fails = self.failures
        if fails:
            first = fails[0]
            more = f" (and {len(fails) - 1} more failed checks)" if len(fails) > 1 else ""
            raise VerificationError(first.file, f"{first.check}: {first.reason}{more}", hint=f"bundle {self.bundle} was refused")


# ---- pure checks -------------------------------------------------------------


@dataclass(frozen=True)
class ManifestVerdict:
    manifest: Manifest
    key_id: str
    checks: tuple[Check, ...]


def verify_manifest(manifest_bytes: bytes, sig_bytes: bytes, trusted_keys: Keys, *, allow_dev_key: bool = False) -> ManifestVerdict:
    """Signature by a trusted key over the exact manifest bytes, then format version and schema.

    The development key is trusted only when allow_dev_key is set, and a manifest
    must say truthfully whether it was signed with it. Raises VerificationError.
    """
    trusted = trust(trusted_keys)
    if allow_dev_key:
        trusted[DEV_KEY_ID] = development_key().public_key
    key_id = verify_signature(manifest_bytes, sig_bytes, trusted, subject=MANIFEST_FILE, sig_name=SIGNATURE_FILE)
    manifest = parse_manifest(manifest_bytes)
    is_dev = key_id == DEV_KEY_ID
    if is_dev != manifest.dev_key:
        raise VerificationError(
            MANIFEST_FILE, f"records dev_key: {str(manifest.dev_key).lower()} but was signed with {'the development key' if is_dev else 'key ' + key_id[:16] + '...'}"
        )
    checks = [Check("signature", SIGNATURE_FILE, "pass", f"ed25519 signature by trusted key {key_id[:16]}...")]
    if is_dev:
        if not allow_dev_key:
            raise VerificationError(
                SIGNATURE_FILE, "signed with the public development key: it proves the bytes are intact, not who built them",
                hint="rebuild with --key (edgekit keys generate DIR), or pass --allow-dev-key for local testing",
            )
        checks[0] = Check("signature", SIGNATURE_FILE, "warn", "signed with the public development key (allowed): integrity only, not origin")
    checks.append(Check("manifest", MANIFEST_FILE, "pass", f"{manifest.format} format_version {manifest.format_version}, schema valid"))
    return ManifestVerdict(manifest, key_id, tuple(checks))


def check_files(manifest: Manifest, observed: Observed) -> list[Check]:
    """Every listed file present with its sha256 and size; nothing unlisted besides manifest.json/.sig."""
    checks = []
    for path, entry in sorted(manifest.files.items()):
        got = observed.get(path)
        if got is None:
            checks.append(Check("file", path, "fail", "missing: listed in the manifest but not in the bundle"))
        elif got[1] != entry.size:
            checks.append(Check("file", path, "fail", f"size {got[1]} bytes, the manifest says {entry.size}"))
        elif got[0] != entry.sha256:
            checks.append(Check("file", path, "fail", f"sha256 {got[0][:16]}... does not match the manifest ({entry.sha256[:16]}...): the file was modified"))
        else:
            checks.append(Check("file", path, "pass", "sha256 and size match"))
    for path in sorted(set(observed) - set(manifest.files) - RESERVED_FILES):
        checks.append(Check("file", path, "fail", "extra file: not listed in the signed manifest"))
    return checks


def check_plugins(manifest: Manifest, read: Callable[[str], bytes], intact: set[str]) -> list[Check]:
    """Each plugin's metadata: strict schema, agreement with the manifest and target, known operator/ABI.

    Only files in `intact` (hash verified) are parsed.
    """
    checks = []
    for ref in manifest.plugins:
        path = f"{ref.path}/{PLUGIN_METADATA_FILE}"
        damaged = sorted(f"{ref.path}/{f}" for f in manifest.plugin_files(ref) if f"{ref.path}/{f}" not in intact)
        if damaged:
            checks.append(Check("plugin", path, "skip", f"not checked: {damaged[0]} failed its file check"))
            continue
        try:
            meta = parse_plugin_metadata(read(path), name=path)
            problems = [
                f"{k} {getattr(meta, k)!r} differs from the manifest's {v!r}"
                for k, v in (("op", ref.op), ("version", ref.version), ("abi_version", ref.abi_version), ("arch", manifest.target.arch))
                if getattr(meta, k) != v
            ]
            if problems:
                raise VerificationError(path, problems[0])
            listed = set(manifest.plugin_files(ref))
            expected = set(meta.file_names())
            if listed != expected:
                missing, extra = sorted(expected - listed), sorted(listed - expected)
                raise VerificationError(path, f"plugin directory holds {sorted(listed)}; plugin.json needs {sorted(expected)} (missing {missing}, unexpected {extra})")
            check_operator_compat(meta, name=path)
            check_kernel_files(meta, {f: read(f"{ref.path}/{f}") for f in meta.file_names() if f != PLUGIN_METADATA_FILE}, prefix=f"{ref.path}/")
        except VerificationError as e:
            checks.append(Check("plugin", e.file, "fail", e.reason))
            continue
        k = meta.kernels
        checks.append(Check("plugin", path, "pass", f"{ref.op} v{ref.version}: {len(k)} kernel(s), {arch_name(meta.arch)}, Triton {meta.triton_version}, max shared {max(x.shared_bytes for x in k)} B"))
    return checks


def check_arch(manifest: Manifest, local_arch: Optional[int]) -> Check:
    """Target arch vs this machine: reported, never a failure (bundles are built on other hosts)."""
    t = manifest.target.arch
    if local_arch is None:
        return Check("arch", MANIFEST_FILE, "skip", f"no CUDA GPU here; the bundle targets {manifest.target.name} ({arch_name(t)}); golden vectors run on the CPU reference")
    here, there = arch_name(local_arch), arch_name(t)
    if local_arch == t:
        return Check("arch", MANIFEST_FILE, "pass", f"this GPU is {here}, the bundle's target arch: the cubins load here")
    if local_arch > t:
        return Check("arch", MANIFEST_FILE, "warn", f"this GPU is {here}, the bundle targets {there}: cubins will not load, the PTX is JIT-compiled")
    return Check("arch", MANIFEST_FILE, "warn", f"this GPU is {here}, older than the target {there}: the plugins cannot run here")


def check_golden_file(path: str, data: bytes, run: GoldenRunner, plugin: Optional[str] = None) -> list[Check]:
    """Run every case of one golden file through `run` and compare with its FP64 expectations."""
    try:
        gs = read_golden(data, name=path)
    except VerificationError as e:
        return [Check("golden", e.file, "fail", e.reason)]
    checks = []
    for c in gs.cases:
        v = check_case(gs.op, c, run, plugin)
        where = f" at {v.where} (got {v.actual:.6g}, expected {v.expected:.6g})" if v.where and v.actual is not None else ""
        detail = f"{gs.op} {c.meta.dtype}: max |err| {v.max_abs_err:.3g}, {v.max_ratio:.3g}x of tolerance{where}"
        checks.append(Check("golden", f"{path}#{c.meta.name}", "pass" if v.ok else "fail", detail if v.ok else f"{v.reason}; {detail}"))
    return checks


def golden_files(manifest: Manifest) -> list[tuple[str, Optional[str]]]:
    """(golden file, plugin dir or None): each plugin's vectors, then model-level golden/*.safetensors."""
    out: list[tuple[str, Optional[str]]] = [(f"{p.path}/{PLUGIN_GOLDEN_FILE}", p.path) for p in manifest.plugins]
    out += [(f, None) for f in sorted(manifest.files) if f.startswith("golden/") and f.endswith(".safetensors")]
    return out


def _verify_core(
    report: VerificationReport,
    manifest_bytes: Optional[bytes],
    sig_bytes: Optional[bytes],
    observed: Callable[[], Observed],
    read: Callable[[str], bytes],
    trusted_keys: Keys,
    *,
    allow_dev_key: bool,
    run_golden: Optional[GoldenRunner],
    local_arch: Optional[int],
) -> VerificationReport:
    for name, blob in ((MANIFEST_FILE, manifest_bytes), (SIGNATURE_FILE, sig_bytes)):
        if blob is None:
            report.checks.append(Check("signature" if name == SIGNATURE_FILE else "manifest", name, "fail", "missing: not an edgekit bundle, or an incomplete copy"))
    if manifest_bytes is None or sig_bytes is None:
        return report
    try:
        verdict = verify_manifest(manifest_bytes, sig_bytes, trusted_keys, allow_dev_key=allow_dev_key)
    except VerificationError as e:
        # Nothing else in the bundle can be believed without a good manifest: stop here.
        report.checks.append(Check("signature" if e.file == SIGNATURE_FILE else "manifest", e.file, "fail", e.reason))
        return report
    report.manifest, report.key_id = verdict.manifest, verdict.key_id
    report.checks.extend(verdict.checks)
    try:
        obs = observed()
    except VerificationError as e:
        report.checks.append(Check("file", e.file, "fail", e.reason))
        return report
    file_checks = check_files(verdict.manifest, obs)
    report.checks.extend(file_checks)
    intact = {c.file for c in file_checks if c.status == "pass"}
    files = verdict.manifest.files
    raw_read = read

    def read_verified(rel: str) -> bytes:
        # Re-check the bytes actually parsed: a file swapped after hashing is still caught.
        data = raw_read(rel)
        if sha256_hex(data) != files[rel].sha256:
            raise VerificationError(rel, "changed while the bundle was being verified")
        return data

    read = read_verified
    plugin_checks = check_plugins(verdict.manifest, read, intact)
    report.checks.extend(plugin_checks)
    sound_plugins = {c.file.rsplit("/", 1)[0] for c in plugin_checks if c.status == "pass"}
    report.checks.append(check_arch(verdict.manifest, local_arch))
    if run_golden is None:
        report.checks.append(Check("golden", "golden", "skip", "golden vectors not run (disabled)"))
        return report
    for path, plugin in golden_files(verdict.manifest):
        if path not in intact:
            report.checks.append(Check("golden", path, "skip", "not run: the file failed its hash check"))
            continue
        if plugin is not None and plugin not in sound_plugins:
            report.checks.append(Check("golden", path, "skip", f"not run: {plugin} failed its plugin checks"))
            continue
        try:
            data = read(path)
        except VerificationError as e:
            report.checks.append(Check("golden", e.file, "fail", e.reason))
            continue
        report.checks.extend(check_golden_file(path, data, run_golden, plugin))
    return report


def verify_bundle_bytes(
    files: Mapping[str, bytes],
    trusted_keys: Keys,
    *,
    allow_dev_key: bool = False,
    run_golden: Optional[GoldenRunner] = run_reference,
    local_arch: Optional[int] = None,
    name: str = "bundle",
) -> VerificationReport:
    """Verify a bundle held in memory as {relative path: bytes} (tests, small bundles). Pure."""
    observed = {p: (sha256_hex(b), len(b)) for p, b in files.items()}
    return _verify_core(
        VerificationReport(name), files.get(MANIFEST_FILE), files.get(SIGNATURE_FILE), lambda: observed, lambda p: files[p],
        trusted_keys, allow_dev_key=allow_dev_key, run_golden=run_golden, local_arch=local_arch,
    )


# ---- I/O layer -----------------------------------------------------------------


def detect_local_arch() -> Optional[int]:
    """sm number of this machine's first CUDA GPU, or None without one."""
    try:
        import torch

        if torch.cuda.is_available():
            return arch_of_capability(*torch.cuda.get_device_capability(0))
    except Exception:  # no driver, broken CUDA install: same as no GPU for reporting purposes
        return None
    return None


_AUTO = object()


def verify_bundle(
    path: str | os.PathLike,
    trusted_keys: Keys,
    *,
    allow_dev_key: bool = False,
    run_golden: Optional[GoldenRunner] = run_reference,
    runner_for_root: Optional[Callable[[Path], GoldenRunner]] = None,
    local_arch=_AUTO,
) -> VerificationReport:
    """Verify a bundle directory or a single-file .tar archive. Never modifies the bundle.

    run_golden=None skips the golden vectors; the default runs the torch
    reference on the CPU. runner_for_root (e.g. gpu_runner.plugin_runner) makes
    a runner that needs the bundle's files, once the bundle's root is known; it
    wins over run_golden. An archive is checked member by member before it is
    extracted (to a temporary directory, removed afterwards).
    """
    p = Path(path)
    arch = detect_local_arch() if local_arch is _AUTO else local_arch
    if p.is_file():
        problems = inspect_archive(p)
        if problems:
            report = VerificationReport(str(p))
            report.checks.extend(Check("archive", m.where(p.name), "fail", m.reason) for m in problems)
            return report
        tmp = Path(tempfile.mkdtemp(prefix="edgekit-verify-"))
        try:
            try:
                root = safe_extract(p, tmp / "bundle")
            except EdgekitError as e:
                report = VerificationReport(str(p))
                report.checks.append(Check("archive", getattr(e, "file", p.name), "fail", getattr(e, "reason", str(e))))
                return report
            run = runner_for_root(root) if runner_for_root is not None else run_golden
            report = _verify_dir(root, trusted_keys, allow_dev_key=allow_dev_key, run_golden=run, local_arch=arch)
            report.bundle = str(p)
            report.checks.insert(0, Check("archive", p.name, "pass", "no absolute paths, '..', links, devices or duplicates"))
            return report
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    require_bundle_path(p)
    run = runner_for_root(p) if runner_for_root is not None else run_golden
    return _verify_dir(p, trusted_keys, allow_dev_key=allow_dev_key, run_golden=run, local_arch=arch)


def require_bundle_path(path: str | Path) -> None:
    """Refuse a path that is neither a directory nor a file: the one message verify, run and serve give for it."""
    p = Path(path)
    if str(path).startswith("preset:"):  # a model spec, not a bundle: say which commands take it
        raise VerificationError(str(path), "a model (random-weight preset), not a bundle",
                                hint=f"run it directly with `edgekit generate {path}`, or build a bundle of it with "
                                     f"`edgekit build {path} --target orin -o DIR`")
    if not (p.is_dir() or p.is_file()):
        raise VerificationError(str(p), "no such bundle directory or archive",
                                hint="pass the directory written by `edgekit build` or its .tar")


def _verify_dir(root: Path, trusted_keys: Keys, *, allow_dev_key: bool, run_golden, local_arch) -> VerificationReport:
    def maybe_read(name: str) -> Optional[bytes]:
        f = root / name
        return f.read_bytes() if f.is_file() and not f.is_symlink() else None

    def observed() -> Observed:
        return {rel: sha256_file(root / rel) for rel in list_tree(root)}

    return _verify_core(
        VerificationReport(str(root)), maybe_read(MANIFEST_FILE), maybe_read(SIGNATURE_FILE), observed,
        lambda rel: (root / rel).read_bytes(), trusted_keys, allow_dev_key=allow_dev_key, run_golden=run_golden, local_arch=local_arch,
    )
