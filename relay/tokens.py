"""Bearer tokens, auth-key hashes and the fake prelogin answer for unknown accounts.

Tokens are 256-bit random strings; the relay keeps only their SHA-256. Auth keys are 256-bit
derived keys, so a fast hash is enough (a slow one would only make logins a DoS target), and
comparisons are constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from relay.storage import TokenKind, TokenRecord
from replica.wire import KdfParams, auth_key_hash

_TOKEN_SHAPE = re.compile(r"[A-Za-z0-9_-]{43}")
_NO_KEY_HASH = hashlib.sha256(b"sealsync: no such account").digest()


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> bytes | None:
    """The stored form of a token, or None when it cannot be one of ours."""
    if not _TOKEN_SHAPE.fullmatch(token):
        return None
    return hashlib.sha256(token.encode()).digest()


def new_invite() -> tuple[str, bytes]:
    """An invite token and the hash the relay stores for it."""
    invite = new_token()
    digest = token_hash(invite)
    assert digest is not None
    return invite, digest


def issue(
    account: str, device_id: str, kind: TokenKind, expires_ms: int
) -> tuple[str, TokenRecord]:
    """A new token and the record the relay stores for it."""
    token = new_token()
    digest = token_hash(token)
    assert digest is not None
    return token, TokenRecord(digest, account, device_id, kind, expires_ms)


def key_matches(auth_key: bytes, *stored: bytes | None) -> bool:
    """Whether the key hashes to one of `stored`; the same work when nothing is stored."""
    digest = auth_key_hash(auth_key)
    matched = False
    for candidate in stored:
        matched |= hmac.compare_digest(digest, candidate or _NO_KEY_HASH)
    return matched


def fake_kdf(secret: bytes, account: str) -> KdfParams:
    """Deterministic parameters for an unknown account, shaped like real defaults, so a
    prelogin answer does not tell whether an account exists."""
    salt = hmac.new(secret, b"prelogin\0" + account.encode(), hashlib.sha256).digest()[:16]
    return KdfParams(salt)


_DEVICE_ID = re.compile(r"[0-9a-f]{16}")


def new_device_id() -> str:
    return secrets.token_hex(8)


def is_device_id(value: str) -> bool:
    return _DEVICE_ID.fullmatch(value) is not None
