"""The account-key operations of a `Replica`: what a keyring keeps, the key bundle, and
changing the keys (a passphrase change, the move to signed pushes, a rotation).

A mixin of `Replica` (replica/replica.py), which owns the `Core` these work through; the
design of key generations is docs/key-generations.md.
"""

from __future__ import annotations

from replica.bundles import (
    bundle_bytes,
    generation_of,
    recovery_auth_hash,
    rotated,
    upgraded,
    with_new_passphrase,
)
from replica.core import Core
from replica.keys import LoginKeys
from replica.wire import KdfParams


class KeyOperations:
    """The methods of `Replica` on the account's keys and key bundle."""

    _core: Core

    def unlock_key(self) -> bytes:
        """The raw key a keyring keeps: treat it as the passphrase's equal. It is the account
        key of a version-1 bundle, the generation key of a version-2 one."""
        return self._core.keys().unlock_key

    def key_bundle(self) -> bytes:
        return bundle_bytes(self._core.bundle())

    def recovery_auth_hash(self) -> bytes | None:
        """The relay's hash of the recovery key's auth key, sealed in the bundle: with it and
        the passphrase any unlocked device can register the account again on a relay that
        lost it. None for accounts made before it was kept there (then `auth_key_hash` of
        `recovery_login_keys(key).auth_key`)."""
        return recovery_auth_hash(self._core.bundle(), self._core.keys())

    def kdf_params(self) -> KdfParams:
        """The passphrase's Argon2id parameters and salt (works while locked): the relay hands
        them to a new device at prelogin, so a new key bundle is sent along with them."""
        return self._core.bundle().kdf

    def change_passphrase(self, new_passphrase: str) -> LoginKeys:
        """Wrap the account's keys under a new passphrase; no record is re-encrypted."""
        core = self._core
        with core.mutex, core.write_transaction():  # read and replace under one lock
            bundle, login = with_new_passphrase(
                core.bundle(), core.keys(), new_passphrase, core.options.random_bytes
            )
            core.store.set_meta("bundle", bundle_bytes(bundle))
            return login

    @property
    def key_generation(self) -> int:
        """The key bundle's generation (works while locked): 0 for a version-1 account,
        whose pushes go unsigned until `upgrade_keys`."""
        return generation_of(self._core.bundle())

    def check_keys_current(self) -> None:
        """`ReplicaLockedError` when another process took newer keys into this file since
        this handle was unlocked (a long-lived one, such as a watch, must then unlock again)."""
        with self._core.mutex:
            self._core.refuse_stale_keys()

    def upgrade_keys(self, login: LoginKeys, recovery_key: str, *, device: str) -> None:
        """Move a version-1 account to generation 1 of key bundle version 2, whose pushes are
        signed (docs/key-generations.md §5): the account's own recovery key is asked once,
        the passphrase kept, and no record re-encrypted. The bundle is stored inside one
        write transaction (the caller's `batch`, so it commits once the relay took it);
        its keys take effect at the next unlock."""
        core = self._core
        with core.mutex, core.write_transaction():
            bundle = upgraded(core.bundle(), login, recovery_key, core.key_change(device))
            core.store.set_meta("bundle", bundle_bytes(bundle))

    def rotate_keys(
        self,
        new_passphrase: str,
        *,
        revoked_device: str | None,
        device: str,
        new_recovery_key: str | None = None,
        through_folder: bool = False,
    ) -> LoginKeys:
        """Generation g + 1 of the account's keys, revoking `revoked_device` (the relay takes it
        with `RelayClient.rotate_keys`; a folder, as `keys/bundle-G.bin`): a new passphrase,
        and nothing the revoked device held opens it (nor, with `new_recovery_key`, the
        recovery key it may have seen). Without a device to revoke it only retires the keys
        the old passphrase opened (a folder's passphrase change). Stored inside one write
        transaction (the caller's `batch`, so it commits once the relay or the folder took
        it); unlock with the returned keys then. `through_folder`: the frontier was recorded
        after a folder round, and is enforced by its vector (frontier_of)."""
        core = self._core
        with core.mutex, core.write_transaction():
            keys = core.keys()
            bundle, login = rotated(
                core.bundle(),
                keys,
                new_passphrase,
                core.key_change(device, through_folder=through_folder),
                revoked_device,
                new_recovery_key,
            )
            core.store.set_meta("bundle", bundle_bytes(bundle))
            return login

    def held_for_keys(self) -> int:
        """Versions held because they are sealed under a key epoch this file's bundle does not
        have: another device installed newer keys (cheap, unlike `status()`)."""
        with self._core.mutex:
            self._core.check_open()
            return self._core.store.count_held().get("epoch", 0)
