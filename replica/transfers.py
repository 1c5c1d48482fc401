"""The sessions through which a `Replica` syncs: with a relay (replica/sync.py) or through
a shared folder (replica/folder.py). Both are sans I/O: a driver in clients/ moves the bytes.

A mixin of `Replica` (replica/replica.py), which owns the `Core` these work through.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from replica.core import Core
from replica.envelope import Identity, profile_key
from replica.folder import FolderSession
from replica.restore import check_backup_account
from replica.schema import DEFAULT_PROFILE, PROFILES_COLLECTION
from replica.sync import DEFAULT_BATCH_BYTES, DEFAULT_BATCH_COUNT, SyncSession


@dataclass(frozen=True)
class ProfileBackup:
    """What a backup of one profile holds: `tag` names the profile without saying its name
    (8 hex digits of a local HMAC); the versions of `scopes` (its declared collections),
    and of `keys` (its own entry in the list of profiles, which lives in the default one)."""

    tag: str
    scopes: frozenset[bytes]
    keys: frozenset[bytes]


class Transfers:
    """The methods of `Replica` that start a sync session, and say what a profile's backup
    holds."""

    _core: Core

    def sync_session(
        self,
        *,
        max_batch_count: int = DEFAULT_BATCH_COUNT,
        max_batch_bytes: int = DEFAULT_BATCH_BYTES,
    ) -> SyncSession:
        """A sans-I/O sync session over this replica (see replica.sync)."""
        return SyncSession(
            self._core, max_batch_count=max_batch_count, max_batch_bytes=max_batch_bytes
        )

    def profile_scopes(self, profile: str) -> ProfileBackup:
        """What a backup of one profile keeps (`backup_replica_file(keep=)`)."""
        core = self._core
        with core.mutex:
            keys = core.keys()
            names = [c.name for c in core.schema.collections]
            scopes = frozenset(core.scope(profile, name) for name in names)
            entry = Identity(DEFAULT_PROFILE, PROFILES_COLLECTION, profile)
            listed = frozenset({core.record_key(entry)})
        return ProfileBackup(profile_key(keys, profile)[:4].hex(), scopes, listed)

    def check_backup_account(self, backup: Path) -> None:
        """`StoreError` unless the backup file is one of this account's (a sample of its
        envelopes opens with these keys): a whole restore over this replica asks first."""
        check_backup_account(self._core, backup)

    def folder_session(self, *, max_batch_bytes: int = DEFAULT_BATCH_BYTES) -> FolderSession:
        """A sans-I/O session to sync through a shared folder (see replica.folder)."""
        sync = SyncSession(self._core, max_batch_bytes=max_batch_bytes)
        return FolderSession(self._core, sync)
