"""Ed25519 keys and narinfo signatures, in Nix's key formats.

* a **secret key file** holds ``name:base64(seed ‖ public key)`` (64 bytes, libsodium's and
  Nix's layout), a **public key** is ``name:base64(public key)`` (32 bytes);
* a **signature** is ``name:base64(ed25519(fingerprint))``, one ``Sig:`` line per key, over
  :meth:`harness.cache.format.NarInfo.fingerprint`.

The key name says which trusted key to check a signature with; a path is trusted when at
least one of its signatures verifies under a trusted key of the same name.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from harness.cache.format import CacheConfigError, NarInfo

_KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


@dataclass(frozen=True)
class SecretKey:
    """A signing key and its name."""

    name: str
    key: Ed25519PrivateKey

    def public(self) -> PublicKey:
        return PublicKey(self.name, self.key.public_key())

    def sign(self, info: NarInfo) -> str:
        """The ``name:base64`` signature of ``info``'s fingerprint."""
        return f"{self.name}:{base64.b64encode(self.key.sign(info.fingerprint())).decode()}"


@dataclass(frozen=True)
class PublicKey:
    """A trusted key and its name."""

    name: str
    key: Ed25519PublicKey

    def render(self) -> str:
        raw = self.key.public_bytes(Encoding.Raw, PublicFormat.Raw)
        return f"{self.name}:{base64.b64encode(raw).decode()}"


def generate(name: str) -> SecretKey:
    """A fresh key named ``name`` (letters, digits, ``. _ + -``: it prefixes every signature)."""
    _check_name(name, "key name")
    return SecretKey(name, Ed25519PrivateKey.generate())


def render_secret(secret: SecretKey) -> str:
    from cryptography.hazmat.primitives.serialization import NoEncryption, PrivateFormat

    seed = secret.key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    public = secret.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return f"{secret.name}:{base64.b64encode(seed + public).decode()}"


def write_key_pair(name: str, folder: Path) -> tuple[Path, Path]:
    """``harness store keygen``: write ``<name>.secret`` (mode 0600) and ``<name>.public``.

    Refuses to overwrite either file: a lost secret key cannot be recovered, and a replaced
    one silently invalidates every trust setting that names the old public key.
    """
    secret = generate(name)
    secret_path, public_path = folder / f"{name}.secret", folder / f"{name}.public"
    for path in (secret_path, public_path):
        if os.path.lexists(path):
            raise CacheConfigError(f"{path} exists; not overwriting a key", hint="choose another name")
    folder.mkdir(parents=True, exist_ok=True)
    # O_EXCL with 0600 from the start: the secret is never readable by others, not even briefly.
    fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(render_secret(secret) + "\n")
    public_path.write_text(secret.public().render() + "\n")
    return secret_path, public_path


def parse_secret(text: str, where: str) -> SecretKey:
    """Read a secret key (``name:base64`` of 64 bytes, or of a 32-byte seed)."""
    name, raw = _split(text.strip(), where, "secret key")
    if len(raw) not in (32, 64):
        raise CacheConfigError(f"{where}: a secret key is 64 bytes (seed and public key), got {len(raw)}")
    key = Ed25519PrivateKey.from_private_bytes(raw[:32])
    if len(raw) == 64 and key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) != raw[32:]:
        raise CacheConfigError(f"{where}: the secret key's public half does not belong to its seed")
    return SecretKey(name, key)


def load_secret(path: Path) -> SecretKey:
    try:
        text = path.read_text()
    except OSError as exc:
        raise CacheConfigError(f"cannot read secret key {path}: {exc.strerror or exc}") from None
    return parse_secret(text, str(path))


def parse_public(text: str) -> PublicKey:
    """Read a trusted key ``name:base64`` (32 bytes); a malformed one is a CacheConfigError."""
    name, raw = _split(text.strip(), "trusted-keys", "public key")
    if len(raw) != 32:
        raise CacheConfigError(f"trusted key {text.strip()!r}: a public key is 32 bytes, got {len(raw)}")
    return PublicKey(name, Ed25519PublicKey.from_public_bytes(raw))


def parse_trusted(keys: list[str] | tuple[str, ...]) -> dict[str, list[PublicKey]]:
    """Trusted keys by name (several keys may share a name during a rotation)."""
    trusted: dict[str, list[PublicKey]] = {}
    for text in keys:
        key = parse_public(text)
        trusted.setdefault(key.name, []).append(key)
    return trusted


def signed_by_trusted(info: NarInfo, trusted: Mapping[str, list[PublicKey]]) -> str | None:
    """The name of a trusted key whose signature over ``info`` verifies, else None."""
    fingerprint = info.fingerprint()
    for sig in info.signatures:
        name, _, encoded = sig.partition(":")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            continue
        for key in trusted.get(name, []):
            try:
                key.key.verify(raw, fingerprint)
                return name
            except InvalidSignature:
                continue
    return None


def _split(text: str, where: str, what: str) -> tuple[str, bytes]:
    name, sep, encoded = text.partition(":")
    if not sep:
        raise CacheConfigError(f"{where}: a {what} is 'name:base64', got {text[:40]!r}")
    _check_name(name, f"{where}: key name")
    try:
        return name, base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise CacheConfigError(f"{where}: the {what} {name!r} is not valid base64") from None


def _check_name(name: str, what: str) -> None:
    if not _KEY_NAME.match(name):
        raise CacheConfigError(f"{what} {name!r} must be letters, digits and . _ + - (no ':')")


__all__ = [
    "PublicKey",
    "SecretKey",
    "generate",
    "load_secret",
    "parse_public",
    "parse_secret",
    "parse_trusted",
    "render_secret",
    "signed_by_trusted",
    "write_key_pair",
]
