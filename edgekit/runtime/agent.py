"""The device's update agent: refresh TUF metadata, pick new plugins for this GPU, install them.

One pass (``run_once``):

1. ``tuf.ngclient.Updater.refresh()`` against the repository, starting from the
   root shipped with the device. python-tuf refuses rolled-back versions,
   expired metadata and bad signatures; any of those stops the pass with
   ``UpdateRefused`` and nothing on the device changes.
2. Choose offers (pure, ``choose_offers``): per operator, the newest target for
   this device's arch that is newer than the active version and not blocked.
3. For each offer: ``download_target`` (python-tuf checks length and sha256),
   then the store's normal swap path with ``expect=`` the announced op, version
   and arch, so the signed package itself must agree with the metadata.

Nothing downloaded is imported, unpickled or executed: a plugin is bytes handed
to the store's verifier.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from tuf.api import exceptions as tuf_errors
from tuf.api.metadata import Metadata, TargetFile, Targets
from tuf.api.serialization import DeserializationError
from tuf.ngclient import Updater, Urllib3Fetcher

from edgekit.errors import EdgekitError
from edgekit.http_url import http_url_problem
from edgekit.bundle.plugin_identity import CUSTOM_KEY, SwapRefused, canonical_version, normalize_arch, version_key, version_number
from edgekit.runtime.plugin_store import PluginStore

SOCKET_TIMEOUT_S = 10


class UpdateRefused(EdgekitError):
    """The update repository failed TUF verification; nothing was installed.

    ``reason``: rollback | expired | bad_signature | tampered | download | repository.
    """

    def __init__(self, reason: str, message: str, *, hint: str | None = None):
        self.reason = reason
        super().__init__(f"update refused ({reason}): {message}", hint=hint)


@dataclass(frozen=True)
class Offer:
    path: str
    op: str
    version: str
    target_arch: str


@dataclass
class Outcome:
    path: str
    op: str
    version: str
    action: str  # "applied" | "refused"
    reason: str | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "op": self.op, "version": version_number(self.version), "action": self.action,
                "reason": self.reason, "detail": self.detail}


@dataclass
class AgentReport:
    repo_url: str
    metadata_versions: dict[str, int] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)
    error: UpdateRefused | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and all(o.action == "applied" for o in self.outcomes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "repo": self.repo_url,
            "ok": self.ok,
            "metadata_versions": self.metadata_versions,
            "outcomes": [o.to_dict() for o in self.outcomes],
            "error": None if self.error is None else {"reason": self.error.reason, "message": str(self.error)},
        }


def announced(info: TargetFile) -> dict[str, Any] | None:
    """The edgekit custom fields of a target, or None for a target that is not a plugin."""
    custom = info.custom if isinstance(info.custom, Mapping) else None
    fields = custom.get(CUSTOM_KEY) if custom else None
    return fields if isinstance(fields, Mapping) else None


def choose_offers(
    targets: Mapping[str, TargetFile], device_arch: str, active: Mapping[str, str | None], blocked: Mapping[str, tuple[str, ...]]
) -> list[Offer]:
    """Per operator, the newest plugin for this arch that beats the active version. Pure.

    Targets whose custom fields are missing or malformed are ignored (the repository
    may carry other files); the store re-checks everything against the package.
    """
    arch = normalize_arch(device_arch)
    best: dict[str, Offer] = {}
    for path, info in sorted(targets.items()):
        fields = announced(info)
        if fields is None:
            continue
        try:
            op, version, target_arch = str(fields["op"]), canonical_version(fields["version"]), normalize_arch(fields["target_arch"])
        except (KeyError, SwapRefused):
            continue
        if target_arch != arch or version in blocked.get(op, ()):
            continue
        current = active.get(op)
        if current is not None and version_key(version) <= version_key(current):
            continue
        if op not in best or version_key(version) > version_key(best[op].version):
            best[op] = Offer(path, op, version, target_arch)
    return [best[op] for op in sorted(best)]


def _refusal(e: Exception, where: str) -> UpdateRefused:
    """python-tuf's verdicts, as reasons a fleet dashboard can count; ``where``: the URL the pass was fetching from."""
    if isinstance(e, tuf_errors.BadVersionNumberError):
        return UpdateRefused("rollback", f"the repository served older metadata than this device has seen ({e})",
                             hint="someone replayed old metadata; the device keeps its current plugins")
    if isinstance(e, tuf_errors.ExpiredMetadataError):
        return UpdateRefused("expired", str(e), hint="the publisher must re-sign (edgekit publish --repo DIR refreshes timestamp and snapshot)")
    if isinstance(e, tuf_errors.UnsignedMetadataError):
        return UpdateRefused("bad_signature", str(e), hint="metadata is not signed by the keys in the trusted root")
    if isinstance(e, tuf_errors.LengthOrHashMismatchError):
        return UpdateRefused("tampered", str(e), hint="the served bytes differ from what the signed metadata lists")
    if isinstance(e, tuf_errors.DownloadError):
        return UpdateRefused("download", f"{type(e).__name__} from {where}: {_download_problem(e)}",
                             hint="is the repository URL reachable?")
    return UpdateRefused("repository", f"{type(e).__name__}: {e}")


def _download_problem(e: Exception) -> str:
    """What went wrong in a download, in words. python-tuf raises SlowRetrievalError without any text for every failed
    connection (refused, no such host, timed out: urllib3 counts them all as timeouts), and the refusal read
    'SlowRetrievalError: '; urllib3's reason, its cause, says which."""
    if str(e):
        return str(e)
    cause = e.__cause__
    reason = getattr(cause, "reason", None) or cause  # urllib3's MaxRetryError holds the error of the last try
    return str(reason) if reason is not None else "no answer"


def check_repo_url(repo_url: str) -> str:
    """The repository's base URL, or EdgekitError for one the fetcher cannot use (a folder path, file://), which
    python-tuf's fetcher otherwise reported as an unreachable repository (SlowRetrievalError, DownloadError)."""
    problem = http_url_problem(repo_url)
    if problem is not None:
        raise EdgekitError(f"--repo {repo_url!r} {problem}",
                           hint="serve the folder `edgekit publish` wrote with any static HTTP server and pass its URL, "
                                "e.g. python -m http.server 8080 -d REPO, then --repo http://HOST:8080")
    return repo_url


def trusted_root_problem(data: bytes) -> str | None:
    """Why ``data`` is not TUF root metadata (None when it is). Pure: the device's own file, checked before any
    download, so that a wrong file is not reported as a fault of the repository."""
    try:
        md = Metadata.from_bytes(data)
    except DeserializationError as e:
        cause = f": {type(e.__cause__).__name__} {e.__cause__}" if e.__cause__ is not None else ""
        return f"not TUF metadata ({e}{cause})"
    if md.signed.type != "root":
        return f"{md.signed.type} metadata, not root metadata"
    return None


def _urls(repo_url: str) -> tuple[str, str]:
    base = repo_url.rstrip("/")
    return f"{base}/metadata/", f"{base}/targets/"


def run_once(
    store: PluginStore,
    *,
    repo_url: str,
    trusted_root: bytes,
    cache_dir: str | os.PathLike,
    socket_timeout_s: int = SOCKET_TIMEOUT_S,
) -> AgentReport:
    """One refresh-and-apply pass. Repository failures are reported in ``report.error``;
    per-plugin refusals in ``report.outcomes``. The store changes only through ``install``.
    ``repo_url`` and ``trusted_root`` are the caller's to check once, before its first pass (``check_repo_url``,
    ``trusted_root_problem``: the agent command does, before it opens the store), not at every pass."""
    report = AgentReport(repo_url)
    metadata_url, targets_url = _urls(repo_url)
    metadata_dir = Path(cache_dir) / "metadata"
    metadata_dir.mkdir(parents=True, exist_ok=True)
    for stale in Path(cache_dir).glob(".download-*"):  # left by a pass that was killed mid-download
        shutil.rmtree(stale, ignore_errors=True)
    try:
        updater = Updater(
            metadata_dir=str(metadata_dir), metadata_base_url=metadata_url, target_base_url=targets_url,
            fetcher=Urllib3Fetcher(socket_timeout=socket_timeout_s), bootstrap=trusted_root,
        )
        updater.refresh()
    except (tuf_errors.RepositoryError, tuf_errors.DownloadError) as e:
        report.error = _refusal(e, metadata_url)
        return report
    except ValueError as e:  # python-tuf's other refusals of what it read (the caller checked the trusted root)
        raise UpdateRefused("repository", f"the update failed: {type(e).__name__}: {e}") from e

    listed = _listed_targets(metadata_dir)
    report.metadata_versions = listed[1]
    pointers = {op: store.pointer(op) for op in store.ops()}
    offers = choose_offers(
        listed[0], store.policy.device_arch,
        active={op: p.version for op, p in pointers.items()},
        blocked={op: p.blocked for op, p in pointers.items()},
    )
    for offer in offers:
        report.outcomes.append(_apply(store, updater, offer, Path(cache_dir), targets_url))
    return report


def _listed_targets(metadata_dir: Path) -> tuple[dict[str, TargetFile], dict[str, int]]:
    """Target paths to consider, from the targets metadata refresh() just verified and persisted.

    ngclient has no public "list targets" call. The persisted copy is only a list
    of names here: every decision below re-reads the target through
    ``updater.get_targetinfo`` (the in-memory, verified set), so a local file
    changed behind our back can at worst make us ask about a name that is not there.
    """
    versions: dict[str, int] = {}
    md = Metadata[Targets].from_file(str(metadata_dir / "targets.json"))
    versions["targets"] = md.signed.version
    for role in ("timestamp", "snapshot", "root"):
        p = metadata_dir / f"{role}.json"
        if p.exists():
            versions[role] = Metadata.from_file(str(p)).signed.version
    return dict(md.signed.targets), versions


def _apply(store: PluginStore, updater: Updater, offer: Offer, cache_dir: Path, targets_url: str) -> Outcome:
    outcome = Outcome(offer.path, offer.op, offer.version, "refused")
    try:
        info = updater.get_targetinfo(offer.path)
        if info is None or announced(info) is None:
            outcome.reason, outcome.detail = "repository", "target vanished from the verified metadata"
            return outcome
        with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".download-") as tmp:
            path = updater.download_target(info, filepath=str(Path(tmp) / "package"))
            data = Path(path).read_bytes()
    except (tuf_errors.RepositoryError, tuf_errors.DownloadError) as e:
        err = _refusal(e, targets_url)
        outcome.reason, outcome.detail = err.reason, str(err)
        return outcome
    try:
        result = store.install(data, expect=announced(info))
    except SwapRefused as e:
        outcome.reason, outcome.detail = e.reason, str(e)
        return outcome
    outcome.action, outcome.detail = "applied", f"{result.op} {result.version} on probation (previous {result.previous or 'reference'})"
    return outcome
