"""edgekit.publish: the keys of an existing repository are never made anew."""

from __future__ import annotations

import pytest

from edgekit.publish import PublishError, publish_plugins


def test_an_existing_repository_without_its_keys_is_refused_and_no_keys_are_made(tmp_path):
    """A repository copied without its REPO-keys folder (or --keys mistyped) got four fresh keys written, then the
    refusal 'the root key in the keys directory is not the root key of REPO': a keys folder that can never sign it."""
    repo = tmp_path / "repo"
    publish_plugins(repo, [], describe=None, keys_dir=tmp_path / "keys")
    before = sorted(p.name for p in (repo / "metadata").iterdir())
    for keys in (tmp_path / "elsewhere", None):  # a named folder that is not there, and the default REPO-keys
        with pytest.raises(PublishError) as e:
            publish_plugins(repo, [], describe=None, keys_dir=keys)
        assert "root.pem" in e.value.message and "--keys" in e.value.hint
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "repo-keys").exists()
    assert sorted(p.name for p in (repo / "metadata").iterdir()) == before
    (tmp_path / "keys" / "timestamp.pem").unlink()  # one key lost: named, not replaced by a new one
    with pytest.raises(PublishError, match="timestamp.pem"):
        publish_plugins(repo, [], describe=None, keys_dir=tmp_path / "keys")
    assert not (tmp_path / "keys" / "timestamp.pem").exists()
