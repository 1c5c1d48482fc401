"""A version-1 account as sealsync made it before bundle version 2, with its secrets
(tests/replica/fixtures/bundle_v1.json): no new code makes one, and old ones must keep working."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replica.keys import (
    AccountKeys,
    KeyBundle,
    LoginKeys,
    bundle_from_bytes,
    parse_recovery_key,
    passphrase_login_keys,
    unlock_with_login_keys,
)

V1_FIXTURE: dict[str, Any] = json.loads(
    (Path(__file__).parent / "fixtures" / "bundle_v1.json").read_text()
)


@dataclass(frozen=True)
class V1Account:
    bundle: KeyBundle
    keys: AccountKeys
    recovery_raw: bytes
    login: LoginKeys

    @property
    def bundle_bytes(self) -> bytes:
        return bytes.fromhex(V1_FIXTURE["bundle"])

    @property
    def passphrase(self) -> str:
        return str(V1_FIXTURE["passphrase"])

    @property
    def recovery_key(self) -> str:
        return str(V1_FIXTURE["recovery_key"])


def load_v1_account() -> V1Account:
    """The fixture, unlocked with its passphrase (Argon2id runs once)."""
    bundle = bundle_from_bytes(bytes.fromhex(V1_FIXTURE["bundle"]))
    login = passphrase_login_keys(V1_FIXTURE["passphrase"], bundle.kdf)
    keys = unlock_with_login_keys(bundle, login)
    assert keys.unlock_key == bytes.fromhex(V1_FIXTURE["account_key"])
    return V1Account(bundle, keys, parse_recovery_key(V1_FIXTURE["recovery_key"]), login)
