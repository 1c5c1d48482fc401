"""`clients.access` against a real relay process: what `sync --reseed` does when the relay no
longer takes the device's session — nothing when it does, log in again when the account is
still there, register it again when it is gone (with the recovery key only for a bundle made
before the recovery auth key was sealed in it, with an invite on an invite-only relay)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from clients.access import (
    Reentry,
    has_account,
    login_settings,
    regain_access,
    register_again,
)
from clients.account import log_in
from clients.cli import main
from clients.device import RelaySettings, save_settings
from clients.errors import AccessLostError, InsecureRelayError
from clients.http import RelayClient
from replica import (
    LoginKeys,
    Replica,
    WrongKeyError,
    passphrase_login_keys,
    recovery_login_keys,
)
from replica.bundles import bundle_bytes, parse_bundle
from replica.keys import (
    format_recovery_key,
    open_info,
    with_info,
)
from tests.conftest import PASSPHRASE, Account
from tests.relay.server import RelayProcess
from tests.replica.v1 import V1Account


def login_keys(account: Account) -> LoginKeys:
    """The passphrase's keys for the session account (one Argon2id run)."""
    return passphrase_login_keys(PASSPHRASE, parse_bundle(account.bundle).kdf)


def unexpected() -> str:
    raise AssertionError("the recovery key was asked for")


def bundle_without_recovery_auth_hash(v1: V1Account) -> bytes:
    """A version-1 bundle as sealed before `AccountInfo.recovery_auth_hash` existed."""
    info = open_info(v1.keys.unlock_key, v1.bundle.sealed_info)
    old = msgspec.structs.replace(info, recovery_auth_hash=None)
    return bundle_bytes(with_info(v1.bundle, v1.keys, old, os.urandom))


def test_reseed_access_registers_a_lost_account_then_logs_in_then_leaves_a_working_session(
    start_relay: Callable[..., RelayProcess], account: Account, tmp_path: Path
) -> None:
    relay = start_relay()
    reentry = Reentry("ann", login_keys(account), "laptop", unexpected)
    with Replica.join(tmp_path / "r.db", account.bundle) as replica:
        replica.unlock_with_key(account.key)
        with RelayClient(relay.url) as client:
            assert not has_account(client, replica, "ann")
            assert regain_access(client, replica, reentry) == "registered"
            assert has_account(client, replica, "ann")
            assert regain_access(client, replica, reentry) is None  # the session works
            first = client.session
        with RelayClient(relay.url) as client:  # no session at all: the account is there
            assert regain_access(client, replica, reentry) == "logged_in"
            assert client.session is not None and first is not None
            assert client.session.device_id != first.device_id
            assert client.key_bundle(reentry.login.auth_key).bundle == account.bundle
        with RelayClient(relay.url) as client:  # registered with the sealed recovery auth hash
            log_in(client, "ann", recovery_login_keys(account.recovery_key), "phone")


def test_an_older_bundle_registers_again_only_with_the_accounts_recovery_key(
    start_relay: Callable[..., RelayProcess], v1: V1Account, tmp_path: Path
) -> None:
    relay = start_relay()
    with Replica.join(tmp_path / "r.db", bundle_without_recovery_auth_hash(v1)) as replica:
        replica.unlock_with_key(v1.keys.unlock_key)
        assert replica.recovery_auth_hash() is None
        login = v1.login
        with RelayClient(relay.url) as client:
            another = format_recovery_key(os.urandom(32))
            with pytest.raises(WrongKeyError):
                register_again(client, replica, Reentry("ann", login, "laptop", lambda: another))
            assert not has_account(client, replica, "ann")  # nothing was registered
            reentry = Reentry("ann", login, "laptop", lambda: v1.recovery_key)
            register_again(client, replica, reentry)
        with RelayClient(relay.url) as client:
            log_in(client, "ann", recovery_login_keys(v1.recovery_key), "phone")


def test_a_lost_account_on_an_invite_only_relay_is_registered_again_only_with_an_invite(
    account: Account, tmp_path: Path
) -> None:
    db = tmp_path / "relay.db"
    with (
        RelayProcess(db, tmp_path / "relay.log", open_signup=False) as relay,
        Replica.join(tmp_path / "r.db", account.bundle) as replica,
        RelayClient(relay.url) as client,
    ):
        replica.unlock_with_key(account.key)
        login = login_keys(account)
        with pytest.raises(AccessLostError) as refused:
            register_again(client, replica, Reentry("ann", login, "laptop", unexpected))
        assert "--invite" in str(refused.value.hint) and not has_account(client, replica, "ann")
        made = CliRunner().invoke(main, ["relay", "invite", "--db", str(db)])
        assert made.exit_code == 0, made.output
        invited = Reentry("ann", login, "laptop", unexpected, invite=made.stdout.strip())
        register_again(client, replica, invited)
        assert has_account(client, replica, "ann")


def test_login_keeps_a_saved_insecure_flag_for_the_saved_relay_only(tmp_path: Path) -> None:
    replica = tmp_path / "r.db"
    save_settings(replica, RelaySettings("http://10.0.0.2:8787", "ann", insecure=True))
    assert login_settings(replica, None, None, insecure=False).insecure
    with pytest.raises(InsecureRelayError):
        login_settings(replica, "http://10.0.0.3:8787", None, insecure=False)
    moved = login_settings(replica, "http://10.0.0.3:8787", None, insecure=True)
    assert (moved.url, moved.account, moved.insecure) == ("http://10.0.0.3:8787", "ann", True)
