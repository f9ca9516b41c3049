"""Making and reading plugin packages without Python: what `edgekit plugin pack|list|show` drives.

- ``pack_from_bundle``: one operator's compiled plugin out of a built bundle
  (``plugins/<op>/<version>/``), under a new version number, signed as a package
  for an over-the-air swap. The files are checked against the bundle's manifest
  (sha256 and size) first, so a package never carries bytes the bundle did not sign.
- ``pack_from_kernel_source``: the same operator compiled from a developer's edited
  kernel file (edgekit.builder.kernel_source) at the bundle's tiles and arch; signed
  by the same code as a bundle's plugin.
- ``describe_bundle`` / ``describe_package``: the plugins a bundle directory or a
  package file holds, as plain rows (a store: edgekit.runtime.store_view).

Reading a package here does not trust it: without trusted keys the rows say the
signature was not checked; the device verifies everything again anyway.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional

from edgekit.bundle.archive import read_tar_bytes
from edgekit.bundle.canonical import sha256_hex
from edgekit.bundle.keys import SigningKey, TrustedKeys
from edgekit.bundle.manifest import MANIFEST_FILE, PLUGIN_METADATA_FILE, Manifest, parse_manifest
from edgekit.bundle.plugin import (
    INDEX_FILE,
    MAX_PACKAGE_BYTES,
    PluginMetadata,
    pack_plugin,
    parse_plugin_metadata,
    verify_plugin_package,
)
from edgekit.errors import BundleError, VerificationError
from edgekit.kernels.arch import arch_name


def read_bundle_manifest(bundle: Path) -> Manifest:
    path = Path(bundle) / MANIFEST_FILE
    if not path.is_file():
        raise BundleError(f"{bundle} is not a bundle (no {MANIFEST_FILE})", hint="pass the directory `edgekit build` wrote")
    return parse_manifest(path.read_bytes(), name=str(path))


def bundle_plugin_files(bundle: Path, op: str, version: Optional[int] = None) -> tuple[PluginMetadata, dict[str, bytes]]:
    """The metadata and files of one plugin of a bundle, each file checked against the manifest."""
    manifest = read_bundle_manifest(bundle)
    refs = [r for r in manifest.plugins if r.op == op and (version is None or r.version == version)]
    if not refs:
        have = ", ".join(f"{r.op} v{r.version}" for r in manifest.plugins) or "none"
        raise BundleError(f"{bundle} has no plugin {op}{'' if version is None else f' v{version}'}", hint=f"it ships: {have}")
    ref = max(refs, key=lambda r: r.version)
    root = Path(bundle) / ref.path
    meta = parse_plugin_metadata((root / PLUGIN_METADATA_FILE).read_bytes(), name=f"{ref.path}/{PLUGIN_METADATA_FILE}")
    files = {}
    for name in meta.file_names():
        rel = f"{ref.path}/{name}"
        entry = manifest.files.get(rel)
        data = (root / name).read_bytes() if (root / name).is_file() else None
        if entry is None or data is None:
            raise VerificationError(rel, "missing from the bundle or its manifest", hint="rebuild the bundle")
        if len(data) != entry.size or sha256_hex(data) != entry.sha256:
            raise VerificationError(rel, "does not match the bundle's manifest (the file was modified)", hint="rebuild the bundle")
        files[name] = data
    return meta, files


def pack_from_bundle(
    bundle: Path, op: str, *, version: int, key: SigningKey, from_version: Optional[int] = None,
    target_arch: Optional[int] = None, description: Optional[str] = None,
) -> tuple[PluginMetadata, bytes]:
    """A signed package of `op`'s plugin from `bundle`, renumbered to `version`.

    ``target_arch``: refuse when the bundle's kernels were compiled for another GPU
    (a plugin's cubin runs on one arch only; build a bundle for that target instead).
    """
    meta, files = bundle_plugin_files(bundle, op, from_version)
    check_arch(bundle, meta, target_arch)
    return sign_package(meta, files, version=version, description=description, key=key)


def check_arch(bundle: Path, meta: PluginMetadata, target_arch: Optional[int]) -> None:
    if target_arch is not None and meta.arch != target_arch:
        raise BundleError(
            f"{bundle}'s {meta.op} plugin is compiled for {arch_name(meta.arch)}, the target is {arch_name(target_arch)}",
            hint="pack from a bundle built for that target (edgekit build --target ...)",
        )


def sign_package(meta: PluginMetadata, files: Mapping[str, bytes], *, version: int, description: Optional[str],
          key: SigningKey) -> tuple[PluginMetadata, bytes]:
    """The one packing path of both sources: metadata at `version`, re-validated, signed with the files."""
    if version < 1:
        raise BundleError(f"--version {version}: expected a positive integer (devices refuse a version below the active one)")
    update: dict[str, Any] = {"version": version}
    if description is not None:
        update["description"] = description
    # Re-validate through the schema: a changed field must still satisfy every rule.
    new_meta = PluginMetadata.model_validate({**meta.model_dump(mode="json"), **update})
    files = {n: b for n, b in files.items() if n != PLUGIN_METADATA_FILE}
    return new_meta, pack_plugin(new_meta, files, key)


# ---- reading ------------------------------------------------------------------


def _plugin_row(meta: PluginMetadata, **extra) -> dict[str, Any]:
    return {
        "op": meta.op, "version": meta.version, "abi_version": meta.abi_version, "arch": meta.target_arch,
        "triton_version": meta.triton_version, "kernels": [k.kernel for k in meta.kernels],
        "precision": sorted({k.dtype for k in meta.kernels}), "description": meta.description, **extra,
    }


def describe_package(data: bytes, *, name: str = "package", trusted_keys: Optional[TrustedKeys] = None,
                     allow_dev_key: bool = False) -> dict[str, Any]:
    """One package: verified completely when trusted keys are given, else read with the signature unchecked."""
    if trusted_keys:
        vp = verify_plugin_package(data, trusted_keys, allow_dev_key=allow_dev_key, name=name)
        return _plugin_row(vp.metadata, kind="package", signature=f"verified (key {vp.key_id})", sha256=vp.package_sha256,
                           bytes=len(data), metadata=vp.metadata.model_dump(mode="json"))
    members = read_tar_bytes(data, name=name, max_total_bytes=MAX_PACKAGE_BYTES, max_members=64, flat=True)
    if PLUGIN_METADATA_FILE not in members or INDEX_FILE not in members:
        raise VerificationError(name, "not an edgekit plugin package (no plugin.json or index.json)",
                                hint="pass a .tar written by `edgekit plugin pack`")
    meta = parse_plugin_metadata(members[PLUGIN_METADATA_FILE], name=f"{name}:{PLUGIN_METADATA_FILE}")
    return _plugin_row(meta, kind="package", signature="not checked (pass --trust PUBFILE)", sha256=sha256_hex(data),
                       bytes=len(data), metadata=meta.model_dump(mode="json"))


def describe_bundle(bundle: Path) -> list[dict[str, Any]]:
    manifest = read_bundle_manifest(bundle)
    rows = []
    for ref in sorted(manifest.plugins, key=lambda r: (r.op, r.version)):
        meta = parse_plugin_metadata((Path(bundle) / ref.path / PLUGIN_METADATA_FILE).read_bytes(),
                                     name=f"{ref.path}/{PLUGIN_METADATA_FILE}")
        rows.append(_plugin_row(meta, kind="bundle", source="bundle", path=ref.path, metadata=meta.model_dump(mode="json")))
    return rows


def bundle_plugin_versions(bundle: Path) -> dict[str, int]:
    """op -> version of the plugins a bundle ships (the base of a store that serves it)."""
    return {r.op: r.version for r in read_bundle_manifest(bundle).plugins}

