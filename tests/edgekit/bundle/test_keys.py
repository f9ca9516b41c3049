"""Keys: file modes, overwrite protection, key ids, signatures by untrusted or wrong keys."""

from __future__ import annotations

import hashlib
import os
import stat

import pytest
from cryptography.hazmat.primitives import serialization

from edgekit.bundle.keys import (
    DEV_KEY_ID,
    development_key,
    generate_keypair,
    key_id,
    load_public_key,
    load_signing_key,
    trust,
    verify_signature,
)
from edgekit.errors import BundleError, VerificationError


def test_generate_writes_private_key_mode_0600_and_public_key(tmp_path):
    key_path, pub_path = generate_keypair(tmp_path / "k")
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert key_path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert pub_path.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    sk, pk = load_signing_key(key_path), load_public_key(pub_path)
    assert sk.key_id == key_id(pk)


def test_private_key_is_0600_even_with_a_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        key_path, _ = generate_keypair(tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600


def test_attack_overwrite_existing_key_is_refused_without_force(tmp_path):
    key_path, _ = generate_keypair(tmp_path)
    before = key_path.read_bytes()
    with pytest.raises(BundleError, match="already exists"):
        generate_keypair(tmp_path)
    assert key_path.read_bytes() == before
    generate_keypair(tmp_path, force=True)
    assert key_path.read_bytes() != before


def test_attack_world_readable_private_key_is_refused(tmp_path):
    key_path, _ = generate_keypair(tmp_path)
    os.chmod(key_path, 0o644)
    with pytest.raises(VerificationError, match="mode 0644") as e:
        load_signing_key(key_path)
    assert "chmod 600" in str(e.value)


def test_key_id_is_sha256_of_raw_public_key(tmp_path):
    _, pub_path = generate_keypair(tmp_path)
    pk = load_public_key(pub_path)
    raw = pk.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert key_id(pk) == hashlib.sha256(raw).hexdigest()
    assert load_public_key(tmp_path) is not None  # a directory means DIR/edgekit.pub


def test_development_key_is_fixed_and_flagged():
    a, b = development_key(), development_key()
    assert a.is_dev and a.key_id == b.key_id == DEV_KEY_ID
    assert a.sign(b"m") == b.sign(b"m")  # deterministic: dev builds stay reproducible


def test_signature_round_trip(signing_key, public_key):
    sig = signing_key.sign(b"hello")
    assert verify_signature(b"hello", sig, trust([public_key]), subject="m", sig_name="m.sig") == signing_key.key_id


def test_attack_signature_by_untrusted_key_is_refused(other_key, public_key):
    sig = other_key.sign(b"hello")
    with pytest.raises(VerificationError, match="not trusted") as e:
        verify_signature(b"hello", sig, trust([public_key]), subject="m", sig_name="m.sig")
    assert e.value.file == "m.sig"


def test_attack_modified_message_is_refused(signing_key, public_key):
    sig = signing_key.sign(b"hello")
    with pytest.raises(VerificationError, match="does not match the bytes of m"):
        verify_signature(b"hellp", sig, trust([public_key]), subject="m", sig_name="m.sig")


def test_attack_signature_claiming_a_trusted_key_id_but_made_by_another_key(signing_key, other_key, public_key):
    import json

    forged = json.loads(other_key.sign(b"hello"))
    forged["key_id"] = signing_key.key_id  # claim to be the trusted signer
    with pytest.raises(VerificationError, match="does not match"):
        verify_signature(b"hello", json.dumps(forged).encode(), trust([public_key]), subject="m", sig_name="m.sig")


@pytest.mark.parametrize(
    "doc, reason",
    [
        (b"not json", "not a valid signature document"),
        (b'{"key_id": "00", "algorithm": "ed25519", "signature": "AA=="}', "key_id"),
        (b'{"key_id": "' + b"0" * 64 + b'", "algorithm": "rsa", "signature": "AA=="}', "algorithm"),
        (b'{"key_id": "' + b"0" * 64 + b'", "algorithm": "ed25519", "signature": "AA==", "extra": 1}', "extra"),
    ],
)
def test_attack_malformed_signature_document_is_refused(doc, reason, public_key):
    with pytest.raises(VerificationError, match=reason):
        verify_signature(b"m", doc, trust([public_key]), subject="m", sig_name="m.sig")
