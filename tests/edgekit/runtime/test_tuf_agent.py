"""Fleet distribution: `publish` writes a TUF repository, a local http.server serves it,
the agent refreshes and installs through the store. Each attack is refused with nothing changed."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pytest
from runtime_helpers import tree_digest

import fakepkg
from edgekit.runtime.agent import choose_offers, run_once
from edgekit.runtime.plugin_store import PluginStore
from edgekit.publish import PublishError, publish_plugins

AUTHOR = fakepkg.key_from_seed(1)
describe = fakepkg.verifier(AUTHOR)


@pytest.fixture
def device(tmp_path):
    store = PluginStore.open(tmp_path / "device" / "store", policy=fakepkg.policy("sm_87"), verify=describe,
                             golden_check=fakepkg.golden_check)
    return store, tmp_path / "device" / "tuf"


def publish(repo: Path, *packages: bytes, **kw) -> dict:
    return publish_plugins(repo, list(packages), describe=kw.pop("describe", describe), **kw).to_dict()


def agent(store, cache, url, repo):
    root = (repo / "metadata" / "1.root.json").read_bytes()  # shipped with the device at flashing time
    return run_once(store, repo_url=url, trusted_root=root, cache_dir=cache, socket_timeout_s=5)


def test_happy_path_installs_the_newest_plugin_for_this_arch_per_operator(served, device):
    repo, url = served
    store, cache = device
    publish(repo, fakepkg.pack(AUTHOR, version=1), fakepkg.pack(AUTHOR, version=2),
            fakepkg.pack(AUTHOR, version=9, arch="sm_90"), fakepkg.pack(AUTHOR, op="swiglu", version=4))
    report = agent(store, cache, url, repo)
    assert report.error is None, report.to_dict()
    assert [(o.op, o.version, o.action) for o in report.outcomes] == [("rmsnorm", "2", "applied"), ("swiglu", "4", "applied")]
    assert store.pointer("rmsnorm").version == "2" and store.pointer("swiglu").version == "4"
    assert store.load("rmsnorm").version == 2  # what landed is the signed package

    # nothing new: a second pass changes nothing
    before = tree_digest(store.root)
    assert agent(store, cache, url, repo).outcomes == []
    assert tree_digest(store.root) == before

    # a new version appears; the next pass picks it up and keeps the old one as previous
    result = publish(repo, fakepkg.pack(AUTHOR, version=3))
    assert result["versions"]["targets"] == 3 and result["versions"]["timestamp"] == 3
    report = agent(store, cache, url, repo)
    assert [(o.version, o.action) for o in report.outcomes] == [("3", "applied")]
    assert (store.pointer("rmsnorm").version, store.pointer("rmsnorm").previous) == ("3", "2")


def test_rolled_back_metadata_is_refused(served, device):
    repo, url = served
    store, cache = device
    publish(repo, fakepkg.pack(AUTHOR, version=1))
    old_timestamp = (repo / "metadata" / "timestamp.json").read_bytes()
    publish(repo, fakepkg.pack(AUTHOR, version=2))
    assert agent(store, cache, url, repo).ok
    before = tree_digest(store.root)
    # attack: a mirror replays the older (validly signed) timestamp, hiding version 2's successor
    (repo / "metadata" / "timestamp.json").write_bytes(old_timestamp)
    publish_dir_untouched = tree_digest(repo)
    report = agent(store, cache, url, repo)
    assert report.error is not None and report.error.reason == "rollback", report.to_dict()
    assert report.outcomes == []
    assert tree_digest(store.root) == before and tree_digest(repo) == publish_dir_untouched


def test_expired_metadata_is_refused(served, device):
    repo, url = served
    store, cache = device
    # attack (freeze): a mirror keeps serving metadata whose timestamp expired two days ago
    publish(repo, fakepkg.pack(AUTHOR, version=1), now=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=3))
    before = tree_digest(store.root)
    report = agent(store, cache, url, repo)
    assert report.error is not None and report.error.reason == "expired", report.to_dict()
    assert tree_digest(store.root) == before and store.pointer("rmsnorm").version is None


def test_tampered_target_is_refused(served, device):
    repo, url = served
    store, cache = device
    publish(repo, fakepkg.pack(AUTHOR, version=1))
    assert agent(store, cache, url, repo).ok
    publish(repo, fakepkg.pack(AUTHOR, version=2))
    before = tree_digest(store.root)
    # attack: the served bytes of version 2 are changed after signing (same length)
    (blob,) = (repo / "targets" / "plugins" / "sm_87" / "rmsnorm").glob("*.rmsnorm-2.plugin")
    data = bytearray(blob.read_bytes())
    data[-2] ^= 0x01
    blob.write_bytes(bytes(data))
    report = agent(store, cache, url, repo)
    assert report.error is None
    assert [(o.version, o.action, o.reason) for o in report.outcomes] == [("2", "refused", "tampered")]
    assert tree_digest(store.root) == before and store.pointer("rmsnorm").version == "1"


def test_metadata_signed_by_another_key_is_refused(served, device, tmp_path):
    repo, url = served
    store, cache = device
    publish(repo, fakepkg.pack(AUTHOR, version=1))
    assert agent(store, cache, url, repo).ok
    # attack: someone with their own keys re-signs a newer timestamp for this repository
    rogue = tmp_path / "rogue"
    publish(rogue, fakepkg.pack(AUTHOR, version=1))
    publish(rogue, fakepkg.pack(AUTHOR, version=2))
    shutil.copy(rogue / "metadata" / "timestamp.json", repo / "metadata" / "timestamp.json")
    before = tree_digest(store.root)
    report = agent(store, cache, url, repo)
    assert report.error is not None and report.error.reason == "bad_signature", report.to_dict()
    assert tree_digest(store.root) == before


def test_metadata_that_lies_about_the_package_is_refused_by_the_store(served, device):
    repo, url = served
    store, cache = device

    def lying_describe(data):  # a publisher bug or a compromised targets key: announces v7 for a v2 package
        p = describe(data)
        return fakepkg.FakePlugin(p.op, 7, p.target_arch, p.abi_version, p.files)

    publish(repo, fakepkg.pack(AUTHOR, version=2), describe=lying_describe)
    before = tree_digest(store.root)
    report = agent(store, cache, url, repo)
    assert [(o.version, o.reason) for o in report.outcomes] == [("7", "metadata_mismatch")]
    assert tree_digest(store.root) == before


def test_a_published_version_is_immutable(tmp_path):
    repo = tmp_path / "repo"
    publish(repo, fakepkg.pack(AUTHOR, version=1))
    with pytest.raises(PublishError, match="already published with different bytes"):
        publish(repo, fakepkg.pack(AUTHOR, version=1, extra_files={"notes.txt": b"changed"}))


def test_keys_must_match_the_repository(tmp_path):
    repo = tmp_path / "repo"
    publish(repo, fakepkg.pack(AUTHOR, version=1))
    publish(tmp_path / "other-repo", fakepkg.pack(AUTHOR, version=1), keys_dir=tmp_path / "other-keys")
    with pytest.raises(PublishError, match="not the root key"):  # another repository's keys
        publish(repo, fakepkg.pack(AUTHOR, version=2), keys_dir=tmp_path / "other-keys")
    with pytest.raises(PublishError, match="has no root.pem"):  # no keys at all: none are made (tests/edgekit/test_publish.py)
        publish(repo, fakepkg.pack(AUTHOR, version=2), keys_dir=tmp_path / "no-keys")
    with pytest.raises(PublishError, match="inside the served repository"):
        publish(repo, keys_dir=repo / "keys")


def test_choose_offers_skips_other_arch_older_and_blocked_versions():
    from tuf.api.metadata import TargetFile

    def t(op, version, arch="sm_87"):
        return TargetFile(10, {"sha256": "0" * 64}, f"p/{op}-{version}",
                          {"custom": {"edgekit": {"op": op, "version": version, "target_arch": arch}}})

    targets = {x.path: x for x in (t("rmsnorm", "3"), t("rmsnorm", "5"), t("rmsnorm", "6", "sm_90"),
                                   t("swiglu", "2"), t("swiglu", "1.10"), t("attention_decode", "1"))}
    targets["readme"] = TargetFile(1, {"sha256": "0" * 64}, "readme")  # not a plugin: ignored
    offers = choose_offers(targets, "87", active={"rmsnorm": "3", "attention_decode": "1"}, blocked={"swiglu": ("2",)})
    assert [(o.op, o.version) for o in offers] == [("rmsnorm", "5"), ("swiglu", "1.10")]


def test_republishing_as_told_keeps_a_repository_alive_past_the_targets_and_root_expiry(served, device):
    """`edgekit publish --repo REPO` (no packages) re-signed only snapshot and timestamp: the targets metadata kept the
    expiry of the last publish with plugins (90 days) and root its first one (a year), so a publisher who re-signed
    before every timestamp expiry, as the command says, still had every device refuse the repository as expired."""
    repo, url = served
    store, cache = device
    now = dt.datetime.now(dt.timezone.utc)
    publish(repo, fakepkg.pack(AUTHOR, version=1), now=now - dt.timedelta(days=400))
    result = publish(repo)  # today: the re-sign the command asks for, no new plugins
    for role in ("root", "targets", "snapshot", "timestamp"):
        assert dt.datetime.fromisoformat(result["expires"][role]) > now, (role, result["expires"])
    report = agent(store, cache, url, repo)
    assert report.error is None, report.to_dict()
    assert [(o.version, o.action) for o in report.outcomes] == [("1", "applied")]
    assert report.metadata_versions["root"] == 2  # the device walked from its shipped 1.root.json to the renewed one
    again = publish(repo)  # nothing near its expiry now: only snapshot and timestamp are re-signed
    assert result["renewed"] == ["root", "targets"] and again["renewed"] == []
    assert again["versions"]["root"] == 2 and again["versions"]["targets"] == result["versions"]["targets"]


def test_a_publish_after_an_interrupted_one_serves_its_own_plugins(served, device):
    """A publish stopped before its last write (timestamp.json) leaves N+1.targets.json that no timestamp names. The
    next publish skipped writing its own N+1.targets.json beside it: it said 'published swiglu 4', and devices got
    the interrupted publish's rmsnorm 1 and no swiglu."""
    repo, url = served
    store, cache = device
    publish(repo)
    timestamp_before = (repo / "metadata" / "timestamp.json").read_bytes()
    publish(repo, fakepkg.pack(AUTHOR, version=1))
    (repo / "metadata" / "timestamp.json").write_bytes(timestamp_before)  # as if stopped before its last write
    result = publish(repo, fakepkg.pack(AUTHOR, op="swiglu", version=4))
    assert [a["op"] for a in result["added"]] == ["swiglu"]
    report = agent(store, cache, url, repo)
    assert report.error is None, report.to_dict()
    assert [(o.op, o.version, o.action) for o in report.outcomes] == [("swiglu", "4", "applied")]
    assert store.ops() == ["swiglu"]


def test_a_repository_that_does_not_answer_is_refused_saying_why_and_where(served, device):
    """A refused connection was 'update refused (download): SlowRetrievalError: ' (python-tuf's error has no text) and
    a 404 named no URL; both now say what happened and where the agent fetched from."""
    import socket

    repo, url = served
    store, cache = device
    publish(repo)
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens on it
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    report = agent(store, cache, closed, repo)
    assert report.error.reason == "download"
    assert f"from {closed}/metadata/" in str(report.error) and "Connection refused" in str(report.error), str(report.error)
    report = agent(store, cache, f"{url}/sub", repo)
    assert report.error.reason == "download"
    assert f"from {url}/sub/metadata/: HTTP error occurred with status 404" in str(report.error), str(report.error)
