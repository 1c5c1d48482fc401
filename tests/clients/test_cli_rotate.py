"""Revoking a device of a version-2 account rotates the account's keys (docs/key-generations.md
§6), through the command line on a real relay: the other devices follow after one entry of the
new passphrase, nothing pending is lost, and the revoked device — given every key it held and
a full copy of the relay's database — opens nothing written after the revocation."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from clients.cli import main
from clients.errors import RelayRefusedError
from clients.http import RelayClient
from relay.dialect import VERSION_COLUMNS
from replica import (
    Replica,
    UnknownEpochError,
    WrongKeyError,
    passphrase_login_keys,
    recovery_login_keys,
)
from replica.bundles import generation_of, parse_bundle, unlock_by_key, unlock_by_login
from replica.wire import ErrorCode, LoginRequest, node_to_i64, parse_header
from tests.clients.test_cli import PASSPHRASE, Cli, assert_user_error
from tests.clients.test_cli_admin import NEW_PASSPHRASE, revoke
from tests.relay.server import RelayProcess


def run(cli: Cli, replica: Path, *args: str, passphrase: str, new: str = "") -> Result:
    env = {"SEALSYNC_PASSPHRASE": passphrase, "SEALSYNC_NEW_PASSPHRASE": new,
           "XDG_CONFIG_HOME": str(cli.home / "config")}  # fmt: skip
    result = cli.runner.invoke(main, ["--replica", str(replica), *args], env=env)
    assert result.exit_code == 0, result.output
    return result


def cli_bundle(replica: Path) -> bytes:
    """The key bundle a replica file holds (readable while locked)."""
    with Replica.open(replica) as opened:
        return opened.key_bundle()


def desk_and_phone(cli: Cli, relay: RelayProcess, tmp_path: Path) -> tuple[Path, Path, str, str]:
    """A new account's desk and phone: their replicas, the phone's device id, and the
    recovery key the desk showed."""
    desk, phone = tmp_path / "desk.db", tmp_path / "phone.db"
    made = cli.ok(desk, "init", "--relay", relay.url, "--account", "ann", "--device-name", "desk")
    cli.ok(phone, "join", "--relay", relay.url, "--account", "ann", "--device-name", "phone")
    phone_id = next(d["id"] for d in cli.json_objects(desk, "devices") if d["name"] == "phone")
    assert isinstance(phone_id, str)
    return desk, phone, phone_id, made.stdout.split()[-1]


def put_after(cli: Cli, desk: Path) -> None:
    """A write after the rotation, under the new passphrase."""
    run(
        cli,
        desk,
        "put",
        "threads",
        "after",
        '{"title": "not for the phone"}',
        passphrase=NEW_PASSPHRASE,
    )


def plant(relay: RelayProcess, envelope: bytes) -> None:
    """Store an envelope on the relay as a relay that lets it through would (its database
    is edited: the relay itself refuses the revoked device's pushes)."""
    assert relay.db is not None
    header = parse_header(envelope)
    with sqlite3.connect(relay.db) as db:
        account, head = db.execute("SELECT id, head FROM accounts WHERE name = 'ann'").fetchone()
        row = (account, head + 1, header.key, node_to_i64(header.node), header.hlc,
               header.vector_bytes, hashlib.sha256(envelope).digest(), envelope, 0)  # fmt: skip
        db.execute(f"INSERT INTO versions ({VERSION_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)", row)
        db.execute("UPDATE accounts SET head = ? WHERE id = ?", (head + 1, account))
    db.close()


def phone_writes_with_old_keys(cli: Cli, phone: Path) -> bytes:
    """The revoked phone overwrites "before" with the keys it kept; its envelope."""
    cli.ok(phone, "put", "threads", "before", '{"title": "taken over"}')
    with sqlite3.connect(phone) as db:
        (envelope,) = db.execute("SELECT envelope FROM versions WHERE dirty = 1").fetchone()
    db.close()
    return bytes(envelope)


def relay_envelopes(relay: RelayProcess) -> list[bytes]:
    assert relay.db is not None
    with sqlite3.connect(relay.db) as db:
        rows = db.execute("SELECT envelope FROM versions ORDER BY seq").fetchall()
    db.close()
    return [envelope for (envelope,) in rows]


@pytest.mark.slow
def test_revoking_a_device_rotates_the_keys_and_the_others_follow_with_one_entry(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    relay = start_relay()
    desk, laptop, phone = (tmp_path / f"{name}.db" for name in ("desk", "laptop", "phone"))
    cli.ok(desk, "init", "--relay", relay.url, "--account", "ann", "--device-name", "desk")
    for path in (laptop, phone):
        cli.ok(path, "join", "--relay", relay.url, "--account", "ann", "--device-name", path.stem)
    cli.ok(desk, "put", "threads", "before", '{"title": "everyone saw this"}')
    for path in (desk, laptop, phone):
        cli.ok(path, "sync")
    phone_id = next(d["id"] for d in cli.json_objects(desk, "devices") if d["name"] == "phone")
    assert isinstance(phone_id, str)
    cli.ok(laptop, "put", "threads", "pushed", '{"title": "not pulled by the desk yet"}')
    cli.ok(laptop, "sync")  # the revoke pulls it first, so the frontier covers it
    cli.ok(laptop, "put", "threads", "pending", '{"title": "written during the rotation"}')

    assert "rotated" in revoke(cli, desk, phone_id).stdout
    put_after(cli, desk)
    run(cli, desk, "sync", passphrase=NEW_PASSPHRASE)
    followed = run(cli, laptop, "sync", passphrase=PASSPHRASE, new=NEW_PASSPHRASE)
    assert "took the account's newer keys" in followed.stdout, followed.output
    assert f"revoking device {phone_id}" in followed.stdout and "('desk')" in followed.stdout
    run(cli, desk, "sync", passphrase=NEW_PASSPHRASE)
    newcomer = tmp_path / "newcomer.db"
    run(cli, newcomer, "join", "--relay", relay.url, "--account", "ann", "--device-name",
        "newcomer", passphrase=NEW_PASSPHRASE)  # fmt: skip
    run(cli, newcomer, "sync", passphrase=NEW_PASSPHRASE)
    for path in (desk, laptop, newcomer):
        for record in ("before", "pushed", "pending", "after"):
            assert run(cli, path, "get", "threads", record, passphrase=NEW_PASSPHRASE).stdout

    stopped = cli(phone, "sync", "--retry-for", "1")  # it says so, and does not log in again
    assert_user_error(stopped, "this device was revoked", "devices --revoke")
    plant(relay, phone_writes_with_old_keys(cli, phone))
    for path in (desk, laptop):
        env = {"SEALSYNC_PASSPHRASE": NEW_PASSPHRASE}
        refused = cli.runner.invoke(main, ["--replica", str(path), "sync"], env=env)
        assert refused.exit_code == 3, refused.output
        assert "1 untrusted" in refused.stdout and "revoked device" in refused.stderr
        got = run(cli, path, "get", "threads", "before", passphrase=NEW_PASSPHRASE).stdout
        assert "everyone saw this" in got
    after = [e for e in relay_envelopes(relay) if parse_header(e).epoch == 1]
    assert after, "the rotation's new epoch seals what is written next"
    with Replica.open(phone) as revoked:  # every key the phone ever held
        revoked.unlock(PASSPHRASE)
        opener = revoked._core.opener_or_raise()
        for envelope in after:
            with pytest.raises(UnknownEpochError):
                opener.open(envelope)
        old_key, old_kdf = revoked.unlock_key(), revoked.kdf_params()
    new_bundle = parse_bundle(cli_bundle(desk))
    with pytest.raises(WrongKeyError):  # its generation key opens nothing of g + 1
        unlock_by_key(new_bundle, old_key)
    with pytest.raises(WrongKeyError):  # nor does the old passphrase
        unlock_by_login(new_bundle, passphrase_login_keys(PASSPHRASE, new_bundle.kdf))
    assert new_bundle.kdf != old_kdf


@pytest.mark.slow
def test_a_rotation_with_a_new_recovery_key_leaves_the_old_one_opening_nothing_new(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    """The revoked device may have seen the recovery key (it is shown on the device that made
    the account): `--new-recovery-key` wraps generation g + 1 to a new one, and the relay
    takes the new one's logins in place of the old one's."""
    relay = start_relay()
    desk, _, phone_id, old_key = desk_and_phone(cli, relay, tmp_path)
    rotated = revoke(cli, desk, phone_id, "--new-recovery-key")
    new_key = rotated.stderr.split()[-1]
    assert new_key != old_key and "new recovery key" in rotated.stderr
    with Replica.open(desk) as replica:
        with pytest.raises(WrongKeyError):
            replica.unlock_with_recovery_key(old_key)
        replica.unlock_with_recovery_key(new_key)
    with RelayClient(relay.url) as client:
        with pytest.raises(RelayRefusedError) as refused:
            client.login(LoginRequest("ann", recovery_login_keys(old_key).auth_key, "thief"))
        assert refused.value.code == ErrorCode.BAD_CREDENTIALS
        client.login(LoginRequest("ann", recovery_login_keys(new_key).auth_key, "owner"))


@pytest.mark.slow
def test_a_rotation_refuses_the_current_passphrase_and_a_stray_flag(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    """A revoked device that knows the current passphrase would open a generation wrapped to
    it: the rotation refuses it and changes nothing."""
    relay = start_relay()
    desk, _, phone_id, _ = desk_and_phone(cli, relay, tmp_path)
    env = {"SEALSYNC_PASSPHRASE": PASSPHRASE, "SEALSYNC_NEW_PASSPHRASE": PASSPHRASE,
           "XDG_CONFIG_HOME": str(cli.home / "config")}  # fmt: skip
    args = ["--replica", str(desk), "devices", "--revoke", phone_id]
    assert_user_error(cli.runner.invoke(main, args, env=env), "current one")
    assert len(cli.json_objects(desk, "devices")) == 2
    stray = cli(desk, "devices", "--new-recovery-key")
    assert stray.exit_code == 2 and "only with --revoke" in stray.stderr


@pytest.mark.slow
def test_after_a_wipe_the_revoked_devices_account_is_refused_by_the_others(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    """The relay loses everything; the revoked phone registers the account again with the
    keys it kept (generation 1). The desk, at generation 2, follows the hints to a login —
    and refuses that account: its session there ends at once, and it pushes nothing there
    (docs/key-generations.md §7). The laptop, offline through the rotation, holds the very
    keys the phone kept: it cannot tell, so it names the device that registered the account
    and pushes nothing until the person trusts it."""
    relay = start_relay()
    desk, phone, phone_id, recovery_key = desk_and_phone(cli, relay, tmp_path)
    laptop = tmp_path / "laptop.db"
    cli.ok(laptop, "join", "--relay", relay.url, "--account", "ann", "--device-name", "laptop")
    revoke(cli, desk, phone_id)
    put_after(cli, desk)
    cli.ok(laptop, "put", "threads", "offline", '{"title": "not for the phone"}')

    relay.stop()
    assert relay.db is not None
    for suffix in ("", "-wal", "-shm"):
        Path(f"{relay.db}{suffix}").unlink(missing_ok=True)
    relay.start()
    assert (
        "registered it again" in run(cli, phone, "sync", "--reseed", passphrase=PASSPHRASE).stdout
    )
    before = relay_envelopes(relay)

    env = {"SEALSYNC_RECOVERY_KEY": recovery_key, "XDG_CONFIG_HOME": str(cli.home / "config")}
    args = ["--replica", str(desk), "login", "--recovery-key"]
    assert_user_error(cli.runner.invoke(main, args, env=env), "older keys", "accounts --delete")
    assert_user_error(cli(desk, "sync", "--retry-for", "1", passphrase=NEW_PASSPHRASE))
    asked = cli(laptop, "sync", "--reseed")
    assert_user_error(asked, "device 'phone' registered account 'ann' again", "--trust-account")
    assert_user_error(cli(laptop, "sync", "--retry-for", "1"), "does not take this device's")
    stray = cli(laptop, "sync", "--trust-account")
    assert stray.exit_code == 2 and "only with --reseed" in stray.stderr
    assert relay_envelopes(relay) == before  # nothing of the desk's or the laptop's got there


@pytest.mark.slow
def test_a_rotation_that_keeps_the_passphrase_says_what_it_leaves_open(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    """For a device known to be destroyed: the keys rotate (its tokens and signing key end),
    the passphrase stays, and the other devices follow once the person enters it again (a
    bundle their own passphrase opens could be the revoked device's, which knows it)."""
    relay = start_relay()
    desk, _, phone_id, _ = desk_and_phone(cli, relay, tmp_path)
    laptop = tmp_path / "laptop.db"
    cli.ok(laptop, "join", "--relay", relay.url, "--account", "ann", "--device-name", "laptop")
    cli.ok(laptop, "put", "threads", "pending", '{"title": "written during the rotation"}')
    env = {"SEALSYNC_PASSPHRASE": PASSPHRASE, "XDG_CONFIG_HOME": str(cli.home / "config")}
    args = ["--replica", str(desk), "devices", "--revoke", phone_id, "--keep-passphrase"]
    done = cli.runner.invoke(main, args, env=env)
    assert done.exit_code == 0, done.output
    assert "can open the new keys" in done.stderr and "rotated" in done.stdout
    assert generation_of(parse_bundle(cli_bundle(desk))) == 2
    assert len(cli.json_objects(desk, "devices")) == 2  # desk and laptop
    unattended = cli(laptop, "sync")  # nobody to enter it: nothing taken
    assert unattended.exit_code != 0 and "changed on another device" in unattended.output
    followed = run(cli, laptop, "sync", passphrase=PASSPHRASE, new=PASSPHRASE)
    assert "took the account's newer keys" in followed.stdout, followed.output
    cli.ok(desk, "sync")
    assert "written during the rotation" in cli.ok(desk, "get", "threads", "pending").stdout
    stray = cli(desk, "devices", "--keep-passphrase")
    assert stray.exit_code == 2 and "only with --revoke" in stray.stderr
