"""`edgekit publish`, `edgekit agent` and `edgekit store` end to end, with real signed packages."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

import realpkg
from runtime_helpers import tree_digest
from edgekit.bundle.plugin_identity import SwapRefused
from edgekit.cli import _register_commands, app
from edgekit.errors import EdgekitError

AUTHOR = realpkg.key(1)


@pytest.fixture(scope="module")
def cli():
    _register_commands()
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(app, [str(a) for a in args])

    return invoke


@pytest.fixture
def files(tmp_path):
    pub = tmp_path / "author.pub"
    pub.write_bytes(AUTHOR.public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    pkgs = {v: tmp_path / f"rmsnorm-{v}.tar" for v in (1, 2)}
    for v, p in pkgs.items():
        p.write_bytes(realpkg.pack(AUTHOR, v))
    return pub, pkgs


def test_help_texts_name_the_essentials(cli):
    assert "--trusted-root" in cli("agent", "--help").output
    assert "--repo" in cli("publish", "--help").output
    out = cli("store", "--help").output
    assert all(w in out for w in ("status", "install", "confirm", "rollback"))


def test_publish_then_agent_once_then_store_rollback(cli, served, files, tmp_path):
    repo, url = served
    pub, pkgs = files
    r = cli("publish", pkgs[1], pkgs[2], "--repo", repo, "--trust", pub, "--json")
    assert r.exit_code == 0, r.output
    published = json.loads(r.stdout)
    assert [a["version"] for a in published["added"]] == [1, 2]  # numbers, as the signed plugin.json has them
    assert not (repo / "keys").exists() and (tmp_path / "repo-keys" / "root.pem").exists()

    store = tmp_path / "device"
    # the file --json names to ship is the one the text, --help and the README name: 1.root.json
    assert published["trusted_root"] == str(repo / "metadata" / "1.root.json")
    agent = ("agent", "--repo", url, "--trusted-root", published["trusted_root"], "--store", store,
             "--target", "orin", "--trust", pub, "--once", "--json")
    r = cli(*agent)
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert [(o["op"], o["version"], o["action"]) for o in report["outcomes"]] == [("rmsnorm", 2, "applied")]

    r = cli("store", "rollback", "rmsnorm", "--store", store, "--target", "sm_87", "--trust", pub, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["version"] is None  # v1 was never installed: back to reference
    r = cli("store", "status", "--store", store, "--target", "sm_87", "--trust", pub, "--json")
    (row,) = json.loads(r.stdout)["operators"]
    assert (row["version"], row["blocked"]) == (None, [2])


def test_store_status_with_the_wrong_trust_or_target_is_refused_and_deletes_nothing(cli, files, tmp_path):
    """A mistyped --trust or --target once made `store status` drop, delete and block the served version."""
    pub, pkgs = files
    store = tmp_path / "device"
    r = cli("store", "install", pkgs[1], "--store", store, "--target", "orin", "--trust", pub, "--json")
    assert r.exit_code == 0 and "golden vectors run on cpu" in r.output, r.output  # install runs them, and says so
    stranger = tmp_path / "stranger.pub"
    stranger.write_bytes(realpkg.key(2).public_key.public_bytes(serialization.Encoding.PEM,
                                                                 serialization.PublicFormat.SubjectPublicKeyInfo))
    before = tree_digest(store)
    for trust, target in ((stranger, "orin"), (pub, "sm_90")):
        r = cli("store", "status", "--store", store, "--target", target, "--trust", trust, "--json")
        # refused as every EdgekitError is: main() prints it and exits with its code, 2
        assert isinstance(r.exception, EdgekitError) and r.exception.exit_code == 2, r.output
        assert "Nothing was changed" in str(r.exception) and "--trust" in r.exception.hint
        assert tree_digest(store) == before
    r = cli("store", "status", "--store", store, "--target", "orin", "--trust", pub, "--json")
    (row,) = json.loads(r.stdout)["operators"]
    assert (row["version"], row["blocked"]) == (1, [])
    assert "golden vectors" not in r.output  # status runs none: it no longer says where they run


def test_agent_once_exits_2_like_every_refusal_when_the_repository_is_refused(cli, served, files, tmp_path):
    repo, url = served
    pub, pkgs = files
    assert cli("publish", pkgs[1], "--repo", repo, "--trust", pub).exit_code == 0
    other = tmp_path / "other-root.json"  # a root from another repository: nothing here verifies against it
    assert cli("publish", pkgs[1], "--repo", tmp_path / "elsewhere", "--trust", pub).exit_code == 0
    other.write_bytes((tmp_path / "elsewhere" / "metadata" / "1.root.json").read_bytes())
    r = cli("agent", "--repo", url, "--trusted-root", other, "--store", tmp_path / "device", "--target", "sm_87",
            "--trust", pub, "--once", "--json")
    assert r.exit_code == 2 == EdgekitError.exit_code  # the code main() gives any EdgekitError (a refusal)
    assert json.loads(r.stdout)["error"]["reason"] == "bad_signature"


def test_a_plugin_version_is_a_number_in_every_json_document(cli, served, files, tmp_path):
    """plugin.json (signed) stores the version as a number; `plugin list --json` of a package said 1 while the
    store, the agent and publish said "1"."""
    import tarfile

    repo, url = served
    pub, pkgs = files
    with tarfile.open(pkgs[2]) as tar:
        signed = json.loads(tar.extractfile("plugin.json").read())["version"]
    assert signed == 2 and type(signed) is int
    published = json.loads(cli("publish", pkgs[2], "--repo", repo, "--trust", pub, "--json").stdout)
    store = tmp_path / "device"
    agent = json.loads(cli("agent", "--repo", url, "--trusted-root", repo / "metadata" / "1.root.json", "--store", store,
                           "--target", "orin", "--trust", pub, "--once", "--json").stdout)
    status = json.loads(cli("store", "status", "--store", store, "--target", "sm_87", "--trust", pub, "--json").stdout)
    listed = {kind: json.loads(cli("plugin", "list", path, "--json").stdout)[0]
              for kind, path in (("package", pkgs[2]), ("store", store))}
    pointer = json.loads(cli("store", "rollback", "rmsnorm", "--store", store, "--target", "sm_87", "--trust", pub,
                             "--json").stdout)
    versions = {"publish": published["added"][0]["version"], "agent": agent["outcomes"][0]["version"],
                "store status": status["operators"][0]["version"], "plugin list (package)": listed["package"]["version"],
                "plugin list (store)": listed["store"]["version"], "store rollback (blocked)": pointer["blocked"][0]}
    assert versions == dict.fromkeys(versions, signed) and all(type(v) is int for v in versions.values()), versions


class _SecondPass(Exception):
    """Raised where a looping agent would sleep before its second pass: the refusal under test did not happen."""


@pytest.fixture
def one_pass(monkeypatch):
    """A looping agent (no --once) stops at its first wait with _SecondPass, so a refusal that regressed fails the
    test instead of hanging it."""
    import time
    import types

    import edgekit.commands.ota_commands as ota

    def stop(_seconds):
        raise _SecondPass

    # the command module's own `time` only: the process's time.sleep stays as it is for every other thread
    shim = types.SimpleNamespace(**{n: getattr(time, n) for n in dir(time) if not n.startswith("_")})
    shim.sleep = stop
    monkeypatch.setattr(ota, "time", shim)


@pytest.mark.parametrize("repo_arg", ["repo", "file:///srv/repo", "http://", "http://[::1"])
def test_agent_refuses_a_repo_that_is_not_an_http_url_by_name(cli, files, tmp_path, repo_arg, one_pass):
    """A folder path or file:// URL was fetched anyway: a urllib3 FutureWarning, then 'SlowRetrievalError ... is the
    repository URL reachable?' (a refused repository, retried every --interval without --once)."""
    pub, pkgs = files
    repo = tmp_path / "repo"
    assert cli("publish", pkgs[1], "--repo", repo, "--trust", pub).exit_code == 0
    r = cli("agent", "--repo", repo_arg, "--trusted-root", repo / "metadata" / "1.root.json", "--store",
            tmp_path / "device", "--target", "orin", "--trust", pub, "--interval", 1)
    assert isinstance(r.exception, EdgekitError) and r.exception.exit_code == 2, r.output
    assert "--repo" in r.exception.message and "http(s) URL" in r.exception.message
    assert not (tmp_path / "device").exists()  # refused before the store was opened


@pytest.mark.parametrize("content, said", [
    (b"{not json", "not TUF metadata"),
    (b'{"a": 1}', "not TUF metadata"),
    (None, "targets metadata, not root metadata"),  # the repository's 1.targets.json
    ("dir", "is not a file"),
])
def test_agent_names_a_trusted_root_that_is_not_root_metadata(cli, served, files, tmp_path, content, said, one_pass):
    """The device's own --trusted-root was reported as a fault of the repository ('update refused (repository):
    DeserializationError', 'Expected 'root', got 'targets''), and a looping agent retried it for ever."""
    repo, url = served
    pub, pkgs = files
    assert cli("publish", pkgs[1], "--repo", repo, "--trust", pub).exit_code == 0
    root = tmp_path / "root.json"
    if content == "dir":
        root.mkdir()
    else:
        root.write_bytes(content if content is not None else (repo / "metadata" / "1.targets.json").read_bytes())
    r = cli("agent", "--repo", url, "--trusted-root", root, "--store", tmp_path / "device", "--target", "orin",
            "--trust", pub, "--interval", 1)  # not --once: refused at once all the same
    assert isinstance(r.exception, EdgekitError) and r.exception.exit_code == 2, r.output
    assert str(root) in r.exception.message and said in r.exception.message, r.exception.message
    assert "1.root.json" in r.exception.hint


@pytest.mark.parametrize("hours", ["240", "inf", "1e30"])
def test_publish_refuses_a_timestamp_that_outlives_the_snapshot(cli, served, files, tmp_path, hours):
    """--timestamp-expiry-hours accepted any number: 240 promised ten days the snapshot signed with it (7 days) did
    not keep, and inf or 1e30 ended in an OverflowError traceback. Refused now, as a bad value, nothing written."""
    import datetime as dt

    from edgekit.bundle.keys import load_public_key, trust
    from edgekit.commands.ota_commands import SNAPSHOT_EXPIRY_HOURS, _open_store
    from edgekit.publish import DEFAULT_EXPIRY, publish_plugins
    from edgekit.runtime.agent import run_once
    from edgekit.runtime.plugin_checks import package_verifier

    assert SNAPSHOT_EXPIRY_HOURS == DEFAULT_EXPIRY["snapshot"] / dt.timedelta(hours=1)
    repo, url = served
    pub, pkgs = files
    r = cli("publish", pkgs[1], "--repo", repo, "--trust", pub, "--timestamp-expiry-hours", hours)
    assert r.exit_code == 2 and "168" in r.output and not isinstance(r.exception, OverflowError), r.output
    assert list(repo.iterdir()) == []
    # why the cap: a ten-day timestamp published eight days ago is refused by a device all the same
    publish_plugins(repo, [pkgs[1].read_bytes()], describe=package_verifier(trust([load_public_key(pub)])),
                    now=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=8),
                    expiry={"timestamp": dt.timedelta(days=10)})
    store = _open_store(tmp_path / "device", "orin", [pub], False)
    report = run_once(store, repo_url=url, trusted_root=(repo / "metadata" / "1.root.json").read_bytes(),
                      cache_dir=tmp_path / "tuf")
    assert report.error is not None and report.error.reason == "expired" and "snapshot" in str(report.error)


@pytest.mark.parametrize("interval", ["inf", "1e12"])
def test_agent_refuses_an_interval_it_cannot_sleep_before_it_touches_the_store(cli, served, files, tmp_path, interval):
    """--interval inf (or 1e12) ran a pass, installing what it found, then died in time.sleep with an OverflowError
    traceback (under systemd's Restart=, a pass at every restart). Refused now as a bad value, before any pass."""
    repo, url = served
    pub, pkgs = files
    assert cli("publish", pkgs[1], "--repo", repo, "--trust", pub).exit_code == 0
    r = cli("agent", "--repo", url, "--trusted-root", repo / "metadata" / "1.root.json", "--store", tmp_path / "device",
            "--target", "orin", "--trust", pub, "--interval", interval)
    assert r.exit_code == 2 and "604800" in r.output and not isinstance(r.exception, OverflowError), r.output
    assert not (tmp_path / "device").exists()


@pytest.mark.parametrize("command", [("status",), ("confirm", "rmsnorm"), ("rollback", "rmsnorm")])
def test_store_commands_that_install_nothing_refuse_a_path_that_is_no_store(cli, files, tmp_path, command):
    """A mistyped --store was created as an empty store and answered from ('no operators', exit 0; 'unknown operator'),
    as if the device's store were empty. Refused now, naming the path, and nothing is made there."""
    pub, _ = files
    (tmp_path / "empty").mkdir()
    for store, said in ((tmp_path / "typo", "does not exist"), (tmp_path / "empty", "is not a plugin store")):
        r = cli("store", *command, "--store", store, "--target", "orin", "--trust", pub, "--json")
        assert isinstance(r.exception, EdgekitError) and r.exception.exit_code == 2, r.output
        assert f"--store {store} {said}" in r.exception.message and "store install" in r.exception.hint
    assert not (tmp_path / "typo").exists() and list((tmp_path / "empty").iterdir()) == []


def test_publish_says_a_directory_is_not_a_package(cli, files, tmp_path):
    """`publish DIR` said 'plugin package DIR not found' for a directory that is there."""
    pub, _ = files
    (tmp_path / "folder").mkdir()
    r = cli("publish", tmp_path / "folder", "--repo", tmp_path / "repo", "--trust", pub)
    assert isinstance(r.exception, EdgekitError) and "is a directory, expected a package file" in r.exception.message
    assert not (tmp_path / "repo").exists()


def test_store_install_of_a_missing_package_makes_no_store(cli, files, tmp_path):
    """`store install TYPO.tar --store NEW` created NEW (an empty store) and then failed with the bare OSError
    'cannot read plugin package ...: [Errno 2] ...' and no hint. Refused now before the store is opened, as publish
    refuses it."""
    pub, _ = files
    (tmp_path / "folder").mkdir()
    for package, said in ((tmp_path / "typo.tar", "not found"), (tmp_path / "folder", "is a directory")):
        r = cli("store", "install", package, "--store", tmp_path / "device", "--target", "orin", "--trust", pub,
                "--golden-backend", "cpu", "--json")
        assert isinstance(r.exception, EdgekitError) and r.exception.exit_code == 2, r.output
        assert r.exception.message.startswith(f"plugin package {package} {said}"), r.exception.message
        assert "plugin was packed" in r.exception.hint
    assert not (tmp_path / "device").exists()


def test_store_install_of_a_package_a_new_store_would_refuse_makes_no_store(cli, files, tmp_path):
    """A package refused on its signature (an untrusted signer) or its arch (--target of another GPU) created the new
    --store as an empty store before the refusal; `store status` then answered from it. Checked before now, by the
    store's own checks."""
    pub, pkgs = files
    other = tmp_path / "other.pub"
    other.write_bytes(Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    for trust, target, reason in ((other, "orin", "untrusted_key"), (pub, "h200", "wrong_arch")):
        r = cli("store", "install", pkgs[1], "--store", tmp_path / "device", "--target", target, "--trust", trust,
                "--golden-backend", "cpu")
        assert isinstance(r.exception, SwapRefused) and r.exception.exit_code == 2, (r.output, r.exception)
        assert r.exception.reason == reason, (reason, r.exception)
        assert not (tmp_path / "device").exists()
    r = cli("store", "install", pkgs[1], "--store", tmp_path / "device", "--target", "orin", "--trust", pub,
            "--golden-backend", "cpu")
    assert r.exit_code == 0 and (tmp_path / "device" / "ops").is_dir(), r.output


def test_publish_of_a_damaged_package_names_it_and_makes_no_repository(cli, files, tmp_path):
    """`publish good.tar damaged.tar --repo NEW` created NEW and NEW-keys (a TUF root and four keys), then refused with
    'package:kernel.cubin: ...', naming no file of the two. The packages are verified first now, the refusal names
    the file, and nothing is made."""
    pub, pkgs = files
    damaged = bytearray(pkgs[2].read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    (tmp_path / "damaged.tar").write_bytes(bytes(damaged))
    r = cli("publish", pkgs[1], tmp_path / "damaged.tar", "--repo", tmp_path / "repo", "--trust", pub, "--json")
    assert isinstance(r.exception, EdgekitError) and r.exception.exit_code == 2, r.output
    assert f"{tmp_path / 'damaged.tar'}:" in r.exception.message, r.exception.message
    assert not (tmp_path / "repo").exists() and not (tmp_path / "repo-keys").exists()
