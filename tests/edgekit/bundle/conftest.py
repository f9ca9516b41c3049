"""Fixtures for the bundle tests: key pairs on disk and a small, real, signed bundle.

Builders live in bundle_builders.py (a uniquely named module, so it never clashes
with another test directory's helpers when the whole suite runs in one session).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

# Re-exported: tests/edgekit/runtime/realpkg.py loads these builders from this file.
from bundle_builders import (  # noqa: E402,F401
    fake_cubin,
    fake_ptx,
    rmsnorm_golden,
    rmsnorm_metadata,
    rmsnorm_plugin_files,
    write_bundle,
)

from edgekit.bundle.keys import SigningKey, generate_keypair, load_public_key, load_signing_key  # noqa: E402


@pytest.fixture(scope="session")
def keydir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("keys")
    generate_keypair(d)
    return d


@pytest.fixture(scope="session")
def signing_key(keydir) -> SigningKey:
    return load_signing_key(keydir / "edgekit.key")


@pytest.fixture(scope="session")
def public_key(keydir):
    return load_public_key(keydir / "edgekit.pub")


@pytest.fixture(scope="session")
def other_key(tmp_path_factory) -> SigningKey:
    d = tmp_path_factory.mktemp("other-keys")
    generate_keypair(d)
    return load_signing_key(d / "edgekit.key")


@pytest.fixture()
def bundle(tmp_path, signing_key) -> Path:
    return write_bundle(tmp_path / "bundle", signing_key)
