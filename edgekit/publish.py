"""The publisher's side of fleet distribution: a TUF repository any static HTTP server can serve.

Layout (python-tuf metadata, consistent snapshots, ed25519 keys)::

    REPO/metadata/1.root.json, root.json      root (1.root.json ships with devices; root.json = latest;
                                               N.root.json when a re-sign renews it)
    REPO/metadata/N.targets.json               plugin list with custom fields per target
    REPO/metadata/N.snapshot.json
    REPO/metadata/timestamp.json               replaced last: the one file that publishes
    REPO/targets/plugins/<arch>/<op>/<sha256>.<op>-<version>.plugin

Every publish writes new files first (new target blobs, N+1.targets.json,
N+1.snapshot.json; never one a served timestamp names) and atomically replaces
timestamp.json last, so a client polling mid-publish sees either the old
repository or the new one. Keys live in a separate directory
(``KEYS/<role>.pem``, 0600) that is never served; in production root and
targets keys belong offline.

A target's ``custom`` field carries what the device agent selects on:
``{"edgekit": {"op", "version", "target_arch", "abi_version"}}``. The agent
re-checks all of it against the signed package itself before installing.
"""

from __future__ import annotations

import datetime as dt
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import MetaFile, Metadata, Root, Snapshot, TargetFile, Targets, Timestamp
from tuf.api.serialization.json import JSONSerializer

from edgekit.errors import EdgekitError
from edgekit import durable
from edgekit.bundle.plugin_identity import (
    CUSTOM_KEY, VerifiedPluginLike, canonical_version, check_name, normalize_arch, version_number,
)

ROLES = ("root", "targets", "snapshot", "timestamp")
# How long each role's signature stays valid. The timestamp is short on purpose:
# a device that cannot get a fresh one stops trusting the repository (freeze attack).
DEFAULT_EXPIRY = {
    "root": dt.timedelta(days=365),
    "targets": dt.timedelta(days=90),
    "snapshot": dt.timedelta(days=7),
    "timestamp": dt.timedelta(days=1),
}

Describe = Callable[[bytes], VerifiedPluginLike]


class PublishError(EdgekitError):
    """The TUF repository or its keys could not be read or written."""


@dataclass
class PublishResult:
    repo: Path
    added: list[dict] = field(default_factory=list)  # one per published plugin
    versions: dict[str, int] = field(default_factory=dict)  # role -> metadata version now served
    expires: dict[str, str] = field(default_factory=dict)
    trusted_root: Path | None = None  # the file to ship to devices
    renewed: list[str] = field(default_factory=list)  # roles re-signed only because they were near their expiry

    def to_dict(self) -> dict:
        return {
            "repo": str(self.repo), "added": self.added, "versions": self.versions,
            "expires": self.expires, "trusted_root": str(self.trusted_root), "renewed": self.renewed,
        }


def target_path(op: str, version: str, arch: str) -> str:
    """Where a plugin lives in the repository (arch first, so a fleet of one arch shares a prefix)."""
    return f"plugins/{normalize_arch(arch)}/{check_name('operator', op)}/{op}-{canonical_version(version)}.plugin"


def plugin_custom(plugin: VerifiedPluginLike) -> dict:
    return {
        CUSTOM_KEY: {
            "op": plugin.op,
            "version": version_number(plugin.version),  # a number, as the signed plugin.json has it
            "target_arch": normalize_arch(plugin.target_arch),
            "abi_version": plugin.abi_version,
        }
    }


# -- keys ----------------------------------------------------------------------

def load_or_create_keys(keys_dir: Path) -> tuple[dict[str, CryptoSigner], list[str]]:
    """One ed25519 signer per role from KEYS/<role>.pem; missing ones are generated (0600)."""
    keys_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    signers, created = {}, []
    for role in ROLES:
        path = keys_dir / f"{role}.pem"
        if path.exists():
            mode = stat.S_IMODE(path.stat().st_mode)
            if mode & 0o077:
                raise PublishError(f"TUF key {path} has mode {mode:04o}; group/other may read it", hint=f"chmod 600 {path}")
            try:
                key = serialization.load_pem_private_key(path.read_bytes(), password=None)
            except (ValueError, TypeError) as e:
                raise PublishError(f"TUF key {path} is not an unencrypted PKCS8 PEM key ({e})") from e
            if not isinstance(key, Ed25519PrivateKey):
                raise PublishError(f"TUF key {path} is a {type(key).__name__}; expected ed25519")
            signers[role] = CryptoSigner(key)
        else:
            key = Ed25519PrivateKey.generate()
            pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
            durable.replace_atomically(path, pem, mode=0o600)
            signers[role] = CryptoSigner(key)
            created.append(role)
    return signers, created


# -- the repository --------------------------------------------------------------

class TufRepository:
    """Read the current metadata of REPO, add targets, write the next versions."""

    def __init__(self, repo: Path, signers: Mapping[str, CryptoSigner], *, now: dt.datetime | None = None,
                 expiry: Mapping[str, dt.timedelta] | None = None):
        self.repo = repo
        self.meta_dir = repo / "metadata"
        self.targets_dir = repo / "targets"
        self.signers = dict(signers)
        self.now = (now or dt.datetime.now(dt.timezone.utc)).replace(microsecond=0)
        self.expiry = {**DEFAULT_EXPIRY, **(expiry or {})}

    def _expires(self, role: str) -> dt.datetime:
        return self.now + self.expiry[role]

    # reading ---------------------------------------------------------------
    def exists(self) -> bool:
        return (self.meta_dir / "root.json").exists()

    def _load(self, name: str) -> Metadata:
        path = self.meta_dir / name
        try:
            return Metadata.from_file(str(path))
        except Exception as e:  # tuf raises several types for unreadable files
            raise PublishError(f"cannot read TUF metadata {path}: {e}", hint="is --repo an edgekit TUF repository?") from e

    def current(self) -> tuple[Metadata, Metadata, Metadata, Metadata]:
        """(root, targets, snapshot, timestamp) as served now, following timestamp -> snapshot -> targets."""
        root = self._load("root.json")
        timestamp = self._load("timestamp.json")
        snapshot = self._load(f"{timestamp.signed.snapshot_meta.version}.snapshot.json")
        targets = self._load(f"{snapshot.signed.meta['targets.json'].version}.targets.json")
        for md, role in ((root, "root"), (targets, "targets"), (snapshot, "snapshot"), (timestamp, "timestamp")):
            keyids = root.signed.roles[role].keyids
            if self.signers[role].public_key.keyid not in keyids:
                raise PublishError(
                    f"the {role} key in the keys directory is not the {role} key of {self.repo}",
                    hint="pass the --keys directory this repository was created with",
                )
        return root, targets, snapshot, timestamp

    # writing ---------------------------------------------------------------
    def init(self) -> Path:
        """Root v1 plus empty targets/snapshot/timestamp v1."""
        self.meta_dir.mkdir(parents=True, exist_ok=True)
        self.targets_dir.mkdir(exist_ok=True)
        root = Metadata(Root(expires=self._expires("root")))  # consistent_snapshot defaults to True
        for role in ROLES:
            root.signed.add_key(self.signers[role].public_key, role)
        root.sign(self.signers["root"])
        root_bytes = root.to_bytes(JSONSerializer(compact=False))
        durable.replace_atomically(self.meta_dir / "1.root.json", root_bytes)
        durable.replace_atomically(self.meta_dir / "root.json", root_bytes)
        targets = Metadata(Targets(version=1, expires=self._expires("targets")))
        snapshot = Metadata(Snapshot(version=1, expires=self._expires("snapshot")))
        timestamp = Metadata(Timestamp(version=1, expires=self._expires("timestamp")))
        self._write(targets, snapshot, timestamp, new_targets=True)
        return self.meta_dir / "1.root.json"

    def publish(self, packages: Sequence[bytes], describe: Describe | None) -> PublishResult:
        """Add plugin packages as targets (or, with none, just re-sign snapshot and timestamp).

        ``describe`` verifies a package and says what it is (op, version, arch); required with packages.
        """
        if packages and describe is None:
            raise PublishError("publishing plugins needs a verifier for them", hint="pass --trust with the plugin signer's public key")
        root, targets, snapshot, timestamp = self.current()
        result = PublishResult(self.repo)
        for data in packages:
            plugin = describe(data)
            path = target_path(plugin.op, plugin.version, plugin.target_arch)
            info = TargetFile.from_data(path, data, ["sha256"])
            info.unrecognized_fields["custom"] = plugin_custom(plugin)
            existing = targets.signed.targets.get(path)
            if existing is not None and existing.hashes != info.hashes:
                raise PublishError(
                    f"{path} is already published with different bytes",
                    hint="a published version is immutable: bump the plugin version and publish that",
                )
            blob = self.targets_dir / Path(path).parent / f"{info.hashes['sha256']}.{Path(path).name}"
            blob.parent.mkdir(parents=True, exist_ok=True)
            if not blob.exists():
                durable.replace_atomically(blob, data)
            targets.signed.targets[path] = info
            result.added.append({"path": path, "length": info.length, "sha256": info.hashes["sha256"], **plugin_custom(plugin)[CUSTOM_KEY]})
        # Every role that would expire before the snapshot written now is renewed with it: a re-sign without packages
        # once left targets on the expiry of the last publish with plugins (90 days) and root on its first (a year),
        # and devices refused a repository whose publisher had re-signed before every timestamp expiry, as told.
        renew_by = self._expires("snapshot")
        if root.signed.expires <= renew_by:
            root = self._renew_root(root)
            result.renewed.append("root")
        if not packages and targets.signed.expires <= renew_by:
            result.renewed.append("targets")
        new_targets = bool(packages) or targets.signed.expires <= renew_by
        if new_targets:
            targets.signed.version += 1
            targets.signed.expires = self._expires("targets")
        snapshot.signed.version += 1
        timestamp.signed.version += 1
        self._write(targets, snapshot, timestamp, new_targets=new_targets)
        result.versions = {
            "root": root.signed.version, "targets": targets.signed.version,
            "snapshot": snapshot.signed.version, "timestamp": timestamp.signed.version,
        }
        result.expires = {
            role: md.signed.expires.isoformat()
            for role, md in (("root", root), ("targets", targets), ("snapshot", snapshot), ("timestamp", timestamp))
        }
        # the first root, as the text output, --help and the README say: a device walks from it to the newest
        result.trusted_root = self.meta_dir / "1.root.json"
        return result

    def _renew_root(self, root: Metadata) -> Metadata:
        """The next root version, same keys, a fresh expiry: N+1.root.json (devices walk to it from the root they
        were shipped with; python-tuf checks only the newest one's expiry) and root.json."""
        root.signed.version += 1
        root.signed.expires = self._expires("root")
        root.sign(self.signers["root"])
        root_bytes = root.to_bytes(JSONSerializer(compact=False))
        durable.replace_atomically(self.meta_dir / f"{root.signed.version}.root.json", root_bytes)
        durable.replace_atomically(self.meta_dir / "root.json", root_bytes)
        return root

    def _write(self, targets: Metadata, snapshot: Metadata, timestamp: Metadata, *, new_targets: bool) -> None:
        """Sign and write: targets (if it is a new version), the snapshot naming it, timestamp.json last.

        A new targets version is written even where a file of that name exists: it is what a publish interrupted
        before its timestamp.json left, which no timestamp ever named (served versions are below it). Skipping it
        served the interrupted publish's plugins in place of this one's, under this one's 'published'. A targets
        version that is not new is served already and stays as it is."""
        ser = JSONSerializer(compact=False)
        if new_targets:
            targets.sign(self.signers["targets"])
            durable.replace_atomically(self.meta_dir / f"{targets.signed.version}.targets.json", targets.to_bytes(ser))
        snapshot.signed.expires = self._expires("snapshot")
        snapshot.signed.meta["targets.json"] = MetaFile(version=targets.signed.version)
        snapshot.sign(self.signers["snapshot"])
        durable.replace_atomically(self.meta_dir / f"{snapshot.signed.version}.snapshot.json", snapshot.to_bytes(ser))
        timestamp.signed.expires = self._expires("timestamp")
        timestamp.signed.snapshot_meta = MetaFile(version=snapshot.signed.version)
        timestamp.sign(self.signers["timestamp"])
        durable.replace_atomically(self.meta_dir / "timestamp.json", timestamp.to_bytes(ser))


def publish_plugins(
    repo: str | os.PathLike,
    packages: Sequence[bytes],
    *,
    describe: Describe | None,
    keys_dir: str | os.PathLike | None = None,
    now: dt.datetime | None = None,
    expiry: Mapping[str, dt.timedelta] | None = None,
) -> PublishResult:
    """Create REPO if needed, then publish `packages` (each checked by `describe` first)."""
    repo = Path(repo)
    keys = Path(keys_dir) if keys_dir is not None else default_keys_dir(repo)
    if keys.resolve().is_relative_to(repo.resolve()):
        raise PublishError(f"keys directory {keys} is inside the served repository {repo}", hint="keep --keys outside --repo")
    missing = [f"{role}.pem" for role in ROLES if not (keys / f"{role}.pem").exists()]
    if missing and (repo / "metadata" / "root.json").exists():  # keys made now could never sign this repository
        raise PublishError(f"{repo} is an existing TUF repository, but the keys directory {keys} has no "
                           f"{', '.join(missing)}; nothing was written",
                           hint="pass --keys with the directory this repository was created with")
    signers, _ = load_or_create_keys(keys)
    tuf_repo = TufRepository(repo, signers, now=now, expiry=expiry)
    if not tuf_repo.exists():
        tuf_repo.init()
    return tuf_repo.publish(packages, describe)


def default_keys_dir(repo: Path) -> Path:
    """REPO-keys next to REPO: never inside what the HTTP server serves."""
    return repo.resolve().parent / f"{repo.resolve().name}-keys"
