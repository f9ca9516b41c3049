"""Ed25519 signing keys: generate, load, sign, verify; the development key.

A key id is the sha256 (hex) of the raw 32-byte public key, so the same key has
the same id everywhere, whatever file format it was read from.

The development key is a *well-known* key derived from a fixed, published seed.
Anyone can sign with it, so a signature by it proves integrity (the bytes were
not changed by accident) but never origin. It exists so a build without a real
key can still be verified end to end; a manifest signed with it records
``dev_key: true`` and `verify` refuses it unless the caller allows development
keys. It is fixed (not random) so development builds stay deterministic: same
inputs -> same manifest.sig.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgekit.bundle.canonical import HEX64, canonical_json
from edgekit.durable import fsync_dir
from edgekit.durable import replace_atomically as atomic_write_bytes
from edgekit.errors import BundleError, VerificationError

PRIVATE_KEY_FILE = "edgekit.key"
PUBLIC_KEY_FILE = "edgekit.pub"
ALGORITHM = "ed25519"

# Published on purpose (see the module doc): this key protects nothing.
_DEV_SEED = hashlib.sha256(b"edgekit development key v1 - NOT SECRET - do not ship").digest()

HOW_TO_MAKE_A_KEY = "make one with `edgekit keys generate DIR` and pass DIR/edgekit.key"


def key_id(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


@dataclass(frozen=True)
class SigningKey:
    private_key: Ed25519PrivateKey
    is_dev: bool = False

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self.private_key.public_key()

    @property
    def key_id(self) -> str:
        return key_id(self.public_key)

    def sign(self, message: bytes) -> bytes:
        """A detached signature document (canonical JSON bytes) over `message`."""
        sig = self.private_key.sign(message)  # ed25519 is deterministic: same key + message -> same bytes
        return SignatureDoc(key_id=self.key_id, algorithm=ALGORITHM, signature=base64.b64encode(sig).decode()).to_bytes()


class SignatureDoc(BaseModel):
    """`manifest.sig` / `package.sig`: {"algorithm": "ed25519", "key_id": hex, "signature": base64}."""

    # Documents read from outside are parsed with strict=True (no coercion: "1" is not 1);
    # objects built in code may pass tuples where lists are expected.
    model_config = ConfigDict(extra="forbid", frozen=True)

    key_id: str = Field(pattern=HEX64)
    algorithm: Literal["ed25519"]
    signature: str = Field(min_length=1, max_length=200)

    def to_bytes(self) -> bytes:
        return canonical_json(self.model_dump())


def development_key() -> SigningKey:
    return SigningKey(Ed25519PrivateKey.from_private_bytes(_DEV_SEED), is_dev=True)


DEV_KEY_ID = development_key().key_id


TrustedKeys = Mapping[str, Ed25519PublicKey]


def trust(keys: Iterable[Ed25519PublicKey] | TrustedKeys) -> dict[str, Ed25519PublicKey]:
    """{key_id: public key} from public keys (or an existing mapping, re-keyed by the real ids)."""
    values = keys.values() if isinstance(keys, Mapping) else keys
    return {key_id(k): k for k in values}


def verify_signature(message: bytes, sig_bytes: bytes, trusted: TrustedKeys, *, subject: str, sig_name: str) -> str:
    """Check a detached signature document over `message`; return the signing key id.

    Pure: bytes and keys in, key id out, VerificationError naming `sig_name` otherwise.
    """
    try:
        doc = SignatureDoc.model_validate_json(sig_bytes, strict=True)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "document"
        raise VerificationError(sig_name, f"not a valid signature document ({where}: {first['msg']})") from e
    key = trusted.get(doc.key_id)
    if key is None and doc.key_id == DEV_KEY_ID:
        raise VerificationError(
            sig_name, "signed with the public development key, which is not trusted here (it proves integrity, not origin)",
            hint="sign with a real key (edgekit keys generate DIR; build --key DIR/edgekit.key), or allow development keys for local testing (--allow-dev-key)",
        )
    if key is None:
        raise VerificationError(
            sig_name,
            f"signed by key {doc.key_id[:16]}..., which is not trusted (trusted: {_ids(trusted)})",
            hint="pass the signer's public key with --trust, or re-sign with a trusted key",
        )
    try:
        raw = base64.b64decode(doc.signature, validate=True)
    except binascii.Error as e:
        raise VerificationError(sig_name, "signature is not valid base64") from e
    try:
        key.verify(raw, message)
    except InvalidSignature as e:
        raise VerificationError(
            sig_name, f"ed25519 signature does not match the bytes of {subject} (key {doc.key_id[:16]}...)",
            hint=f"{subject} was modified after signing, or the signature belongs to another file",
        ) from e
    return doc.key_id


def _ids(trusted: TrustedKeys) -> str:
    return ", ".join(k[:16] + "..." for k in trusted) or "none"


# ---- files -----------------------------------------------------------------


def generate_keypair(directory: str | os.PathLike, *, force: bool = False) -> tuple[Path, Path]:
    """Write DIR/edgekit.key (PKCS8 PEM, mode 0600) and DIR/edgekit.pub; refuse to overwrite without force."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    key_path, pub_path = d / PRIVATE_KEY_FILE, d / PUBLIC_KEY_FILE
    if not force:
        for p in (key_path, pub_path):
            if p.exists():
                raise BundleError(
                    f"{p} already exists; refusing to overwrite a key",
                    hint="pass --force to replace it; bundles signed with the old key will then not verify with the new one",
                )
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    pub = private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    # The temp file is created 0600 from the first byte, so the secret is never readable by others.
    atomic_write_bytes(key_path, pem, mode=0o600)
    atomic_write_bytes(pub_path, pub, mode=0o644)
    fsync_dir(d)
    return key_path, pub_path


def chosen_signing_key(key: str | os.PathLike | None, dev_key: bool, what: str) -> SigningKey:
    """The key ``--key`` / ``--dev-key`` choose to sign ``what`` ("a bundle", "a plugin package") with: exactly one."""
    if key is not None and dev_key:
        raise BundleError(f"--key {key} and --dev-key both given: {what} is signed with one key",
                          hint=f"drop --dev-key to sign with {key}, or --key for a local test signed with the public "
                               "development key")
    if key is not None:
        return load_signing_key(key)
    if dev_key:
        return development_key()
    raise BundleError(f"no signing key: {what} must be signed",
                      hint=f"{HOW_TO_MAKE_A_KEY}, or pass --dev-key for a local test signed with the public development "
                           "key, which devices refuse unless told to allow development keys")


def load_signing_key(path: str | os.PathLike) -> SigningKey:
    """Read a PKCS8 PEM ed25519 private key; refuse one that other users can read (like ssh does)."""
    p = Path(path)
    if not p.is_file():
        raise BundleError(f"signing key {p} not found", hint=HOW_TO_MAKE_A_KEY)
    with p.open("rb") as f:  # a public key is a mix-up, not a secret left readable: say so before the mode check
        if f.read(64).lstrip().startswith(b"-----BEGIN PUBLIC KEY-----"):
            private = next((c for c in (p.with_suffix(".key"), p.with_name(PRIVATE_KEY_FILE)) if c.is_file()),
                           p.with_name(PRIVATE_KEY_FILE))  # release.pub's release.key, else edgekit.key beside it
            raise VerificationError(str(p), "this is a public key; signing needs the private key",
                                    hint=f"pass {private} (`edgekit keys generate` writes both), and give the .pub "
                                         "to the devices as --trust")
    mode = stat.S_IMODE(p.stat().st_mode)
    if mode & 0o077:
        raise VerificationError(
            str(p), f"private key has mode {mode:04o}; group/other may read it (expected 0600)", hint=f"chmod 600 {p}"
        )
    try:
        key = serialization.load_pem_private_key(p.read_bytes(), password=None)
    except (ValueError, TypeError) as e:
        raise VerificationError(str(p), f"not an unencrypted PKCS8 PEM private key ({e})", hint=HOW_TO_MAKE_A_KEY) from e
    if not isinstance(key, Ed25519PrivateKey):
        raise VerificationError(str(p), f"expected an ed25519 key, got {type(key).__name__}", hint=HOW_TO_MAKE_A_KEY)
    return SigningKey(key)


def load_public_key(path: str | os.PathLike) -> Ed25519PublicKey:
    """Read a PEM ed25519 public key; a directory means DIR/edgekit.pub."""
    p = Path(path)
    if p.is_dir():
        p = p / PUBLIC_KEY_FILE
    if not p.is_file():
        raise BundleError(f"public key {p} not found", hint="pass the edgekit.pub written by `edgekit keys generate`")
    try:
        key = serialization.load_pem_public_key(p.read_bytes())
    except ValueError as e:
        raise VerificationError(str(p), f"not a PEM public key ({e})") from e
    if not isinstance(key, Ed25519PublicKey):
        raise VerificationError(str(p), f"expected an ed25519 public key, got {type(key).__name__}")
    return key


def public_key_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
