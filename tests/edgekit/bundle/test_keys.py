"""Keys: file modes, overwrite protection, key ids, signatures by untrusted or wrong keys."""

from __future__ import annotations

import hashlib
import os
import stat

import pytest
from cryptography.hazmat.primitives import serialization

from edgekit.bundle.keys import (
    DEV_KEY_ID,
    chosen_signing_key,
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


def test_a_public_key_given_to_sign_with_is_named_as_such_not_told_to_chmod(tmp_path):
    """`--key DIR/edgekit.pub` (0644, as generate writes it) was told to chmod 600 it, then that it is no private
    key: the mix-up is said first, with the file to pass."""
    key_path, pub_path = generate_keypair(tmp_path)
    with pytest.raises(VerificationError, match="this is a public key") as e:
        load_signing_key(pub_path)
    assert str(key_path) in e.value.hint and "chmod" not in str(e.value)
    assert load_signing_key(key_path)  # the private key beside it still loads


def test_a_key_and_the_development_key_together_are_refused_not_one_picked(tmp_path):
    """build / plugin pack with --key K --dev-key signed with K without a word: which key signs is not a guess."""
    key_path, _ = generate_keypair(tmp_path)
    with pytest.raises(BundleError, match="--key .* and --dev-key both given: a plugin package is signed with one key"):
        chosen_signing_key(key_path, True, "a plugin package")
    assert key_id(chosen_signing_key(key_path, False, "a bundle").public_key) != DEV_KEY_ID
    assert key_id(chosen_signing_key(None, True, "a bundle").public_key) == DEV_KEY_ID
    with pytest.raises(BundleError, match="no signing key: a bundle must be signed"):
        chosen_signing_key(None, False, "a bundle")


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


# ---- issue 19: key files, each refusal on its own ------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o640, 0o620, 0o610, 0o604, 0o602, 0o601, 0o700 | 0o007])
def test_attack_private_key_any_group_or_other_permission_bit_is_refused(tmp_path, mode):
    key_path, _ = generate_keypair(tmp_path)
    os.chmod(key_path, mode)
    with pytest.raises(VerificationError, match=f"private key has mode {mode:04o}"):
        load_signing_key(key_path)


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o700])
def test_private_key_readable_only_by_its_owner_loads(tmp_path, mode):
    key_path, pub_path = generate_keypair(tmp_path)
    os.chmod(key_path, mode)
    assert load_signing_key(key_path).key_id == key_id(load_public_key(pub_path))


def _private_file(path, data: bytes):
    path.write_bytes(data)
    os.chmod(path, 0o600)
    return path


def test_attack_private_key_that_is_not_pem_is_refused(tmp_path):
    with pytest.raises(VerificationError, match="not an unencrypted PKCS8 PEM private key") as e:
        load_signing_key(_private_file(tmp_path / "k", b"-----BEGIN PRIVATE KEY-----\nnot base64\n"))
    assert "keys generate" in e.value.hint


def test_attack_encrypted_private_key_is_refused(tmp_path):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw"))
    with pytest.raises(VerificationError, match="not an unencrypted PKCS8 PEM private key"):
        load_signing_key(_private_file(tmp_path / "k", pem))


def test_attack_private_key_of_another_algorithm_is_refused(tmp_path):
    from cryptography.hazmat.primitives.asymmetric import ec

    k = ec.generate_private_key(ec.SECP256R1())
    pem = k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with pytest.raises(VerificationError, match="expected an ed25519 key, got"):
        load_signing_key(_private_file(tmp_path / "k", pem))
    pub = k.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "p.pub").write_bytes(pub)
    with pytest.raises(VerificationError, match="expected an ed25519 public key, got"):
        load_public_key(tmp_path / "p.pub")


def test_missing_key_files_are_clear_errors(tmp_path):
    with pytest.raises(BundleError, match="signing key .* not found") as e:
        load_signing_key(tmp_path / "nope.key")
    assert "keys generate" in e.value.hint
    with pytest.raises(BundleError, match="public key .* not found"):
        load_public_key(tmp_path / "nope.pub")
    with pytest.raises(BundleError, match="edgekit.pub not found"):
        load_public_key(tmp_path)  # a directory without DIR/edgekit.pub
    (tmp_path / "dir.key").mkdir()
    with pytest.raises(BundleError, match="not found"):
        load_signing_key(tmp_path / "dir.key")  # a directory is not a key file


def test_attack_public_key_that_is_not_pem_is_refused(tmp_path):
    (tmp_path / "p.pub").write_bytes(b"ssh-ed25519 AAAA not pem\n")
    with pytest.raises(VerificationError, match="not a PEM public key"):
        load_public_key(tmp_path / "p.pub")


def test_attack_signature_that_is_not_base64_is_refused(signing_key, public_key):
    import json

    doc = json.loads(signing_key.sign(b"m"))
    doc["signature"] = "!!not base64!!"
    with pytest.raises(VerificationError, match="not valid base64"):
        verify_signature(b"m", json.dumps(doc).encode(), trust([public_key]), subject="m", sig_name="m.sig")


def test_attack_development_key_signature_is_refused_unless_trusted(public_key):
    sig = development_key().sign(b"m")
    with pytest.raises(VerificationError, match="public development key, which is not trusted here"):
        verify_signature(b"m", sig, trust([public_key]), subject="m", sig_name="m.sig")
    assert verify_signature(b"m", sig, trust([development_key().public_key]), subject="m", sig_name="m.sig") == DEV_KEY_ID


def test_untrusted_signature_lists_the_trusted_key_ids(other_key, public_key):
    with pytest.raises(VerificationError, match=f"trusted: {key_id(public_key)[:16]}\\.\\.\\.\\)"):
        verify_signature(b"m", other_key.sign(b"m"), trust([public_key]), subject="m", sig_name="m.sig")
    with pytest.raises(VerificationError, match="trusted: none"):
        verify_signature(b"m", other_key.sign(b"m"), {}, subject="m", sig_name="m.sig")


def test_trust_rekeys_a_mapping_by_the_real_key_ids(public_key, signing_key):
    """A mapping that files a key under a wrong id must not let that id's signatures verify with it."""
    assert trust({"0" * 64: public_key}) == {signing_key.key_id: public_key}


@pytest.mark.parametrize("signature, ok", [("", False), ("A" * 200, True), ("A" * 201, False)])
def test_signature_field_length_bounds(signature, ok, public_key):
    doc = b'{"key_id": "' + b"0" * 64 + b'", "algorithm": "ed25519", "signature": "' + signature.encode() + b'"}'
    with pytest.raises(VerificationError) as e:
        verify_signature(b"m", doc, trust([public_key]), subject="m", sig_name="m.sig")
    # a document of the right shape gets as far as the key lookup; a wrong one is refused as a document
    assert ("not trusted" in e.value.reason) is ok, e.value.reason


def test_one_character_signature_is_a_well_formed_document(public_key):
    doc = b'{"key_id": "' + b"0" * 64 + b'", "algorithm": "ed25519", "signature": "A"}'
    with pytest.raises(VerificationError, match="not trusted"):
        verify_signature(b"m", doc, trust([public_key]), subject="m", sig_name="m.sig")


def test_malformed_signature_document_names_its_first_problem(public_key):
    doc = b'{"key_id": "00", "algorithm": "rsa", "signature": "AA=="}'
    with pytest.raises(VerificationError, match=r"not a valid signature document \(key_id: "):
        verify_signature(b"m", doc, trust([public_key]), subject="m", sig_name="m.sig")
    with pytest.raises(VerificationError, match=r"not a valid signature document \(document: "):
        verify_signature(b"m", b"[]", trust([public_key]), subject="m", sig_name="m.sig")


def test_keypair_is_written_into_new_nested_directories_with_fixed_modes(tmp_path):
    old = os.umask(0)
    try:
        key_path, pub_path = generate_keypair(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600 and stat.S_IMODE(pub_path.stat().st_mode) == 0o644
    assert load_signing_key(key_path).is_dev is False


def test_keys_and_signature_documents_cannot_be_altered(signing_key):
    import dataclasses
    import json

    from pydantic import ValidationError

    from edgekit.bundle.keys import SignatureDoc

    with pytest.raises(dataclasses.FrozenInstanceError):
        signing_key.is_dev = True
    doc = SignatureDoc.model_validate(json.loads(signing_key.sign(b"m")))
    with pytest.raises(ValidationError):
        doc.key_id = "0" * 64
