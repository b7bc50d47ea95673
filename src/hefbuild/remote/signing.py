"""Ed25519 signatures of action-cache entries, in the spirit of Nix's signed binary caches.

A key has a name, so a reader can say which key signed what and keys can be rotated:
the secret key file holds `name:BASE64(32-byte seed)`, the public key is
`name:BASE64(32-byte public key)`, a signature is the key's name and the 64 raw bytes (in
an entry: a hefbuild.v1.Signature message, remote/signature.proto).

What is signed binds an action key to one exact result: the text
`hefbuild-ac-1\\0<action key>\\0<sha256 of the result record blob>`. The record names every
output and the log by digest, and each blob is verified against its digest when fetched,
so a signature covers every byte a reader will materialize. A server that accepts any PUT
(nginx does) can therefore serve nothing a trusted key did not vouch for.

Generate a key pair:  doit cache-key NAME  (or  python -m hefbuild.remote.signing NAME FILE)
"""

from __future__ import annotations

import base64
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecError

DOMAIN = b"hefbuild-ac-1"


def signed_text(action_key: str, record_digest: str) -> bytes:
    return DOMAIN + b"\0" + action_key.encode() + b"\0" + record_digest.encode()


@dataclass(frozen=True)
class SigningKey:
    name: str
    seed: bytes

    def __repr__(self) -> str:
        return f"SigningKey({self.name!r}, <hidden>)"

    @classmethod
    def load(cls, path: Path) -> SigningKey:
        shown = f"signing key {path.name}"
        try:
            name, _, b64 = path.read_text().strip().partition(":")
            seed = base64.b64decode(b64, validate=True)
        except (OSError, ValueError) as exc:  # ValueError: binascii.Error, non-ASCII text
            raise SpecError(shown, "", "a file holding 'name:BASE64' (see `doit cache-key`)") \
                from exc
        if not name or len(seed) != 32:
            raise SpecError(shown, "", "a file holding 'name:BASE64' of a 32-byte Ed25519 seed")
        return cls(name, seed)

    def sign(self, action_key: str, record_digest: str) -> str:
        raw = self.sign_raw(action_key, record_digest)
        return f"{self.name}:{base64.b64encode(raw).decode()}"

    def sign_raw(self, action_key: str, record_digest: str) -> bytes:
        """The 64-byte Ed25519 signature (what an entry's Signature message carries)."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        private = Ed25519PrivateKey.from_private_bytes(self.seed)
        return private.sign(signed_text(action_key, record_digest))

    def public(self) -> str:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        pub = Ed25519PrivateKey.from_private_bytes(self.seed).public_key()
        raw = pub.public_bytes(Encoding.Raw, PublicFormat.Raw)
        return f"{self.name}:{base64.b64encode(raw).decode()}"


def verify(signature: str, action_key: str, record_digest: str,
           trusted: tuple[str, ...]) -> str | None:
    """The name of the trusted key that made `signature` ('name:BASE64'), or None."""
    name, _, b64 = signature.partition(":")
    try:
        raw_sig = base64.b64decode(b64, validate=True)
    except ValueError:  # binascii.Error, or text that is not ASCII (from a hostile server)
        return None
    return verify_raw(name, raw_sig, action_key, record_digest, trusted)


def verify_raw(name: str, raw_sig: bytes, action_key: str, record_digest: str,
               trusted: tuple[str, ...]) -> str | None:
    """The name of the trusted key `name` whose signature `raw_sig` is, or None."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    for key in trusted:
        key_name, _, key_b64 = key.partition(":")
        if key_name != name:
            continue
        public = Ed25519PublicKey.from_public_bytes(base64.b64decode(key_b64))
        try:
            public.verify(raw_sig, signed_text(action_key, record_digest))
        except InvalidSignature:
            continue
        return name
    return None


def generate(name: str, path: Path) -> str:
    """Write a new secret key file (mode 0600, never overwritten); return the public key."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
    )

    if not name or ":" in name or any(c.isspace() for c in name):
        raise SpecError("cache-key", "NAME", f"a key name without ':' or spaces, got {name!r}")
    seed = Ed25519PrivateKey.generate().private_bytes(Encoding.Raw, PrivateFormat.Raw,
                                                      NoEncryption())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise SpecError(str(path), "", "exists already; a key file is never overwritten") \
            from None
    except OSError as exc:
        raise SpecError(str(path), "", f"cannot be written ({exc.strerror})") from None
    with os.fdopen(fd, "w") as f:
        f.write(f"{name}:{base64.b64encode(seed).decode()}\n")
    return SigningKey(name, seed).public()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m hefbuild.remote.signing NAME SECRET_KEY_FILE", file=sys.stderr)
        return 2
    try:
        public = generate(argv[0], Path(argv[1]))
    except SpecError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 3
    print(f"secret key written to {argv[1]} (keep it in CI's secrets; never commit it)")
    print(f"public key (put it in hefbuild.toml [cache] trusted_keys): {public}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
