"""`devices`, `profiles` and `passwd`: looking after an account from one of its devices.

`passwd` changes the passphrase on the device and on the relay as one step: the new key
bundle is written inside a replica transaction that commits only once the relay accepted it,
so a refusal (a wrong passphrase, another device's change in between) leaves both as they were.
"""

from __future__ import annotations

import json

import click
from rich.table import Table

from clients.cli.console import ExitCode, err, fail, out, user_errors
from clients.cli.folder import folder_of
from clients.cli.folder_admin import devices_in_folder, passwd_in_folder
from clients.cli.remembered import replace_remembered
from clients.cli.rotation import created_to_text, rotation_passphrase, shown_recovery_key
from clients.cli.settings import CliSettings
from clients.device import device_client, load_settings, opened_replica
from clients.errors import RelayRefusedError
from clients.http import RelayClient
from clients.keys import rotate_revoking, send_key_change, upgrade_keys
from clients.sync import SyncDriver
from replica import Replica, passphrase_login_keys
from replica.errors import InvalidArgumentError
from replica.wire import DeviceInfo, ErrorCode, PutKeyBundle

HINT_BY_PASSWD_REFUSAL: dict[ErrorCode, str] = {
    ErrorCode.VERSION_CONFLICT: "the account's key bundle changed on another device meanwhile; "
    "nothing was changed here: run `sealsync passwd` again",
    ErrorCode.FORBIDDEN: "the relay does not take this device's passphrase: it was changed on "
    "another device; nothing was changed here",
}


def revoke(
    settings: CliSettings,
    client: RelayClient,
    listed: list[DeviceInfo],
    device_id: str,
    new_recovery_key: bool,
    keep_passphrase: bool,
) -> str:
    """Revoke another device of the account; what was done, in words. A version-2 account
    rotates its keys with it (a new passphrase, and a new recovery key if asked), so the
    device keeps nothing that opens what is written next; a version-1 one only ends the
    device's tokens. `keep_passphrase` rotates under the current one, for a device known
    to be destroyed: one that still works and knows it opens the new keys."""
    check_revocable(listed, device_id)
    with opened_replica(settings.replica_path) as replica:
        old = settings.passphrase()
        login = passphrase_login_keys(old, replica.kdf_params())
        if not replica.key_generation:
            if new_recovery_key:
                raise InvalidArgumentError(
                    "a version-1 account's revoke does not rotate its keys",
                    hint="`sealsync upgrade` first; nothing was changed",
                )
            client.revoke_device(device_id, login.auth_key)
            return f"revoked device {device_id} (its keys stay valid: `sealsync upgrade` first)"
        replica.unlock_with_login_keys(login)  # a wrong passphrase stops here
        new = rotation_passphrase(settings, old, keep_passphrase)
        recovery_key = shown_recovery_key() if new_recovery_key else None
        catch_up = SyncDriver(replica, client).sync
        rotate_revoking(client, replica, login, new, device_id, recovery_key, catch_up=catch_up)
        replace_remembered(settings.replica_path, new)
    return (
        f"revoked device {device_id} and rotated the account's keys: other devices take "
        "them at their next sync, with the new passphrase"
    )


def check_revocable(listed: list[DeviceInfo], device_id: str) -> None:
    """This device and unknown ids are refused before the passphrase is asked for."""
    found = next((d for d in listed if d.id == device_id), None)
    if found is None:
        raise InvalidArgumentError(
            f"no device {device_id!r} in this account", hint="`sealsync devices` lists their ids"
        )
    if found.current:
        raise InvalidArgumentError(
            f"{device_id!r} is this device", hint="revoke it from another device of the account"
        )


@click.command("devices")
@click.option("--revoke", "revoke_id", metavar="ID", help="Revoke another device's access.")
@click.option(
    "--new-recovery-key",
    is_flag=True,
    help="With --revoke: replace the recovery key too (the revoked device may have seen it).",
)
@click.option(
    "--keep-passphrase",
    is_flag=True,
    help="With --revoke: keep the passphrase (only for a device known to be destroyed).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_obj
def devices(
    settings: CliSettings,
    revoke_id: str | None,
    new_recovery_key: bool,
    keep_passphrase: bool,
    as_json: bool,
) -> None:
    """The account's devices (this one marked); `--revoke ID` takes one's access away."""
    for flag, given in (("--new-recovery-key", new_recovery_key),
                        ("--keep-passphrase", keep_passphrase)):  # fmt: skip
        if given and revoke_id is None:
            fail(f"{flag} is used only with --revoke", "add --revoke ID", code=ExitCode.USAGE)
    path = settings.replica_path
    with user_errors():
        if (folder := folder_of(path)) is not None:
            flags = (revoke_id, new_recovery_key, keep_passphrase, as_json)
            return devices_in_folder(settings, folder, *flags)
    with user_errors(), device_client(path, load_settings(path)) as client:
        listed = client.devices().devices
        if revoke_id is not None:
            done = revoke(settings, client, listed, revoke_id, new_recovery_key, keep_passphrase)
            (err if as_json else out).print(done)  # stdout: JSON only
            listed = client.devices().devices
    show_devices(listed, as_json)


def show_devices(listed: list[DeviceInfo], as_json: bool) -> None:
    if as_json:
        rows = [{"id": d.id, "name": d.name, "created_ms": d.created_ms, "current": d.current}
                for d in listed]  # fmt: skip
        click.echo(json.dumps(rows))
        return
    table = Table("", "id", "name", "added")
    for d in listed:
        table.add_row("*" if d.current else "", d.id, d.name, created_to_text(d.created_ms))
    out.print(table)
    out.print("* this device")


@click.command("profiles")
@click.option("--create", "name", metavar="NAME", help="Make a profile (it syncs to the others).")
@click.pass_obj
def profiles(settings: CliSettings, name: str | None) -> None:
    """The account's profiles: namespaces of records (`--profile` of put, get, ls…)."""
    with user_errors(), opened_replica(settings.replica_path, settings.passphrase) as replica:
        if name is not None:
            try:
                replica.create_profile(name)
            except InvalidArgumentError as exc:
                fail(str(exc), exc.hint or "choose another profile name")
        names = replica.profiles()
    for profile in names:
        out.print(profile)


@click.command("passwd")
@click.option(
    "--end-other-sessions",
    is_flag=True,
    help="Log every other device out: each logs in again with the new passphrase.",
)
@click.pass_obj
def passwd(settings: CliSettings, end_other_sessions: bool) -> None:
    """Change the account's passphrase, here and on the relay (other devices: `join` with it,
    or `login` once logged out); through a folder, a new key generation the other devices
    take at their next sync."""
    path = settings.replica_path
    with user_errors():
        if (folder := folder_of(path)) is not None:
            return passwd_in_folder(settings, folder, end_other_sessions=end_other_sessions)
    with user_errors(), opened_replica(path) as replica:
        relay = load_settings(path)
        old = settings.passphrase()
        current = passphrase_login_keys(old, replica.kdf_params())
        replica.unlock_with_login_keys(current)  # a wrong passphrase stops here, before sending
        new = settings.new_passphrase()
        if new == old:
            fail("the new passphrase is the current one", "choose a different passphrase")
        try:
            with device_client(path, relay) as client:
                change_passphrase(
                    replica, client, current.auth_key, new, end_other_sessions=end_other_sessions
                )
            replace_remembered(path, new)
        except RelayRefusedError as exc:
            hint = HINT_BY_PASSWD_REFUSAL.get(exc.code)
            if hint is None:
                raise
            fail(str(exc), hint)
    if end_other_sessions:
        out.print("passphrase changed; every other device was logged out (`sealsync login`)")
        return
    out.print("passphrase changed; other devices keep unlocking with the old one until re-joined")


def change_passphrase(
    replica: Replica,
    client: RelayClient,
    current_auth_key: bytes,
    new: str,
    *,
    end_other_sessions: bool = False,
) -> None:
    """Re-wrap the bundle's key under `new` and replace the relay's bundle by compare-and-set
    (ending every other device's session with it, if asked).

    The relay takes a new bundle only with the current passphrase's auth key (a stolen token
    alone must not take the account over). The local change commits only after the relay's
    answer.
    """
    expected_version = client.key_bundle(current_auth_key).version
    with replica.batch():
        login = replica.change_passphrase(new)
        bundle = replica.key_bundle()
        request = PutKeyBundle(
            bundle,
            replica.kdf_params(),
            login.auth_key,
            expected_version,
            current_auth_key,
            end_other_sessions,
        )
        send_key_change(client, request)


@click.command("upgrade")
@click.pass_obj
def upgrade(settings: CliSettings) -> None:
    """Move a version-1 account's keys to version 2, whose pushes the relay verifies. Asks
    for the recovery key once; the passphrase stays. Other devices take the new keys at
    their next sync."""
    path = settings.replica_path
    with user_errors(), opened_replica(path) as replica:
        relay = load_settings(path)
        if replica.key_generation:
            out.print(
                f"the account's keys are already version 2 (generation {replica.key_generation})"
            )
            return
        login = passphrase_login_keys(settings.passphrase(), replica.kdf_params())
        replica.unlock_with_login_keys(login)  # a wrong passphrase stops here, before sending
        recovery_key = settings.recovery_key()
        replica.unlock_with_recovery_key(recovery_key)  # another account's stops here, too
        replica.unlock_with_login_keys(login)
        with device_client(path, relay) as client:
            catch_up = SyncDriver(replica, client).pull
            upgrade_keys(client, replica, login, recovery_key, catch_up=catch_up)
    out.print("the account's keys are version 2 now: its pushes are signed, and other devices")
    out.print("take the new keys at their next sync (with the passphrase)")
