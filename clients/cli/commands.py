"""`init`, `join`, `login`, `sync` and `status`: a device's account, relay and health.

The relay URL, account and session live in the sidecar (`clients.device`); nothing here
prints a token. A failed `init` or `join` leaves no file behind; a failed `sync` leaves the
replica as it was before the step that failed (every step is resumable, docs/architecture.md §9.2).
"""

from __future__ import annotations

import dataclasses
import socket
import threading
from collections.abc import Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from clients.access import (
    Reentry,
    check_way_back,
    explained_refusals,
    follow_relay,
    login_again,
    login_settings,
    regain_access,
)
from clients.account import Secret, join_account, register_account
from clients.cli.chat import reconcile_chats
from clients.cli.console import (
    ExitCode,
    err,
    fail,
    out,
    stopped_by_signals,
    user_errors,
)
from clients.cli.folder import (
    folder_of,
    init_in_folder,
    join_from_folder,
    refuse_relay_options,
    require_relay,
    sync_through_folder,
)
from clients.cli.progress import PROGRESS_MODES, ProgressMode, default_mode, shown_progress
from clients.cli.remembered import forget_remembered, replace_remembered
from clients.cli.reports import report_round, report_sync
from clients.cli.rollback import FOLLOWED, REGAINED_MESSAGE, rollback_hint
from clients.cli.settings import CliSettings
from clients.device import (
    CLI_OPTIONS,
    RelaySettings,
    SessionSaver,
    client_for,
    device_client,
    load_settings,
    opened_replica,
    refuse_existing,
    removed_on_failure,
    save_settings,
)
from clients.errors import RelayRefusedError
from clients.folder import state_path
from clients.http import RelayClient, check_relay_url
from clients.keys import adopt_relay_keys, describe_rotation, needs_newer_keys
from clients.retry import Backoff
from clients.schema import CHAT_SCHEMA
from clients.sync import SyncDriver, SyncReport
from replica import ErrorCode, Replica, RollbackError, passphrase_login_keys

DEFAULT_RETRY_FOR_S = 30.0
DEFAULT_IDLE_SYNC_S = 60.0


def default_device_name() -> str:
    return (socket.gethostname() or "sealsync device")[:128]


def with_options(options: Sequence[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    """Add click options to a command as if stacked above it in this order."""

    def add(command: Any) -> Any:
        for option in reversed(options):
            command = option(command)
        return command

    return add


CA_FILE = click.Path(dir_okay=False, exists=True, resolve_path=True)
"""A CA certificate file (PEM), kept in the settings by its absolute path."""
RELAY_OPTIONS = (
    click.option("--relay", "relay_url", help="The relay's URL."),
    click.option("--account", help="The account's name on the relay."),
    click.option("--insecure", is_flag=True, help="Allow plain http to a host not loopback."),
    click.option(
        "--cacert",
        type=CA_FILE,
        help="Verify the relay's TLS with this CA certificate (PEM), e.g. a self-signed one.",
    ),
    click.option(
        "--device-name", default=default_device_name, help="How the relay lists this device."
    ),
    click.option(
        "--folder",
        type=click.Path(file_okay=False, path_type=Path),
        help="Sync through this folder (kept in step by a file-sync tool) instead of a relay.",
    ),
)
TRUST_ACCOUNT_HELP = (
    "Log in to an account another device registered again after a relay wipe (a device you "
    "trust: not one you revoked)."
)
SYNC_OPTIONS = (
    click.option("--reseed", is_flag=True, help="After a relay wipe or rollback: push everything."),
    click.option(
        "--invite",
        envvar="SEALSYNC_INVITE",
        help="With --reseed: an invite, if the relay lost the account and takes new ones by "
        "invite only.",
    ),
    click.option("--watch", is_flag=True, help="Keep syncing live until Ctrl-C (or SIGTERM)."),
    click.option(
        "--every",
        "idle_sync_s",
        type=click.FloatRange(min=0.1),
        default=DEFAULT_IDLE_SYNC_S,
        show_default=True,
        help="With --watch: sync at least this often (writes by other processes on this "
        "replica are noticed only then).",
    ),
    click.option(
        "--retry-for",
        "retry_for_s",
        type=float,
        default=DEFAULT_RETRY_FOR_S,
        show_default=True,
        envvar="SEALSYNC_RETRY_FOR",
        help="Seconds to keep retrying an unreachable relay.",
    ),
    click.option(
        "--progress",
        "progress_mode",
        type=click.Choice(PROGRESS_MODES),
        envvar="SEALSYNC_PROGRESS",
        help="How to show progress: bars (default on a terminal), one JSON line a step on "
        "stderr (for programs), or none (default otherwise).",
    ),
)


@click.command("init")
@with_options(RELAY_OPTIONS)
@click.option("--invite", envvar="SEALSYNC_INVITE", help="Invite token (unless signup is open).")
@click.pass_obj
def init(
    settings: CliSettings,
    *,
    relay_url: str | None,
    account: str | None,
    insecure: bool,
    cacert: str | None,
    device_name: str,
    folder: Path | None,
    invite: str | None,
) -> None:
    """Make a new account and its first device, with the built-in chat schema."""
    if folder is not None:
        refuse_relay_options(relay_url, account, invite)
        init_in_folder(settings, folder)
    else:
        relay_url, account = require_relay(relay_url, account)
        with user_errors():
            url = check_relay_url(relay_url, insecure=insecure)
        relay = RelaySettings(url, account, insecure, device_name=device_name, cacert=cacert)
        init_on_relay(settings, relay, invite)


def init_on_relay(settings: CliSettings, relay: RelaySettings, invite: str | None) -> None:
    path = settings.replica_path
    account, device_name = relay.account, relay.device_name or default_device_name()
    with user_errors():
        refuse_existing(path)
        with client_for(relay) as client:
            info = client.info()  # unreachable, or another protocol: said before a file exists
            passphrase = settings.passphrase(confirm=True)
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with removed_on_failure(path):
                replica, new = Replica.create(path, CHAT_SCHEMA, passphrase, options=CLI_OPTIONS)
                with closing(replica):
                    bundle = replica.key_bundle()
                    session = register_account(client, account, new, bundle, device_name, invite)
                    # its first push is signed for this state
                    follow_relay(replica, session, info.limits.tombstone_horizon_ms)
                    save_settings(path, relay.with_session(session))
    out.print(f"account {account!r} created on {relay.url}; this device's replica: {path}")
    out.print("recovery key (shown once; keep it somewhere safe, it unlocks the account):")
    click.echo(new.recovery_key)
    forget_remembered(path)  # an entry a deleted file at this path left is stale


@click.command("join")
@with_options(RELAY_OPTIONS)
@click.option("--recovery-key", is_flag=True, help="Prove the account with its recovery key.")
@click.option("--retry-for", "retry_for_s", type=float, default=DEFAULT_RETRY_FOR_S)
@click.pass_obj
def join(
    settings: CliSettings,
    *,
    relay_url: str | None,
    account: str | None,
    insecure: bool,
    cacert: str | None,
    device_name: str,
    folder: Path | None,
    recovery_key: bool,
    retry_for_s: float,
) -> None:
    """Add this device to an existing account, then sync it."""
    if folder is not None:
        refuse_relay_options(relay_url, account, None)
        join_from_folder(settings, folder)
    else:
        relay_url, account = require_relay(relay_url, account)
        with user_errors():
            url = check_relay_url(relay_url, insecure=insecure)
        relay = RelaySettings(url, account, insecure, device_name=device_name, cacert=cacert)
        join_on_relay(settings, relay, recovery_key, retry_for_s)


def join_on_relay(
    settings: CliSettings, relay: RelaySettings, recovery_key: bool, retry_for_s: float
) -> None:
    path = settings.replica_path
    account, device_name = relay.account, relay.device_name or default_device_name()
    with user_errors():
        refuse_existing(path)
        saver = SessionSaver(path, relay)
        with client_for(relay, on_session=saver) as client:
            client.info()  # unreachable, or another protocol: said before asking a secret
            secret = login_secret(settings, recovery_key)
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with removed_on_failure(path):
                replica = join_account(client, path, account, secret, device_name, CLI_OPTIONS)
            forget_remembered(path)  # an entry a deleted file at this path left is stale
            with closing(replica):
                out.print(f"joined account {account!r} on {relay.url}; replica: {path}")
                report_sync(run_sync(replica, client, retry_for_s))


LOGIN_OPTIONS = (
    click.option(
        "--relay", "relay_url", help="The relay's URL (default: this replica's settings)."
    ),
    click.option("--account", help="The account's name (default: this replica's settings)."),
    click.option("--insecure", is_flag=True, help="Allow plain http to a host not loopback."),
    click.option(
        "--cacert",
        type=CA_FILE,
        help="Verify the relay's TLS with this CA certificate (default: this replica's settings).",
    ),
    click.option("--device-name", help="How the relay lists this device (default: as it was)."),
    click.option("--recovery-key", is_flag=True, help="Prove the account with its recovery key."),
    click.option("--trust-account", is_flag=True, help=TRUST_ACCOUNT_HELP),
)


@click.command("login")
@with_options(LOGIN_OPTIONS)
@click.pass_obj
def login(
    settings: CliSettings,
    *,
    relay_url: str | None,
    account: str | None,
    insecure: bool,
    cacert: str | None,
    device_name: str | None,
    recovery_key: bool,
    trust_account: bool,
) -> None:
    """Log this replica in again (lost or revoked tokens, a wiped relay): as the device it was
    when the relay still lists it, else as a new one (a restored backup always is)."""
    path = settings.replica_path
    with user_errors(), opened_replica(path) as replica:
        relay = login_settings(path, relay_url, account, insecure, cacert)
        name = device_name or relay.device_name or default_device_name()
        relay = dataclasses.replace(relay, device_name=name)
        was = relay.session.device_id if relay.session else None
        saver = SessionSaver(path, relay)  # the sidecar is written once the relay said yes
        with client_for(relay, on_session=saver) as client:
            info = client.info()  # unreachable, or another protocol: said before asking a secret
            secret = login_secret(settings, recovery_key)
            session = login_again(client, replica, relay.account, secret, name,
                                  device_id=was, trust_account=trust_account)  # fmt: skip
        finding = follow_relay(replica, session, info.limits.tombstone_horizon_ms)
        state_path(path).unlink(missing_ok=True)  # one transport: a folder's, if any, ends
    out.print(f"logged in to {relay.url} as account {relay.account!r}, device {session.device_id}")
    if finding is not None:
        then = FOLLOWED[finding.then]
        err.print(f"[yellow]note:[/yellow] {finding.rollback}; {then}", markup=True)


def login_secret(settings: CliSettings, recovery_key: bool) -> Secret:
    if recovery_key:
        return Secret(settings.recovery_key(), is_recovery_key=True)
    return Secret(settings.passphrase())


REJOIN_OPTIONS = (
    click.option("--trust-account", is_flag=True, help=f"With --reseed: {TRUST_ACCOUNT_HELP}"),
    click.option(
        "--allow-resurrection",
        is_flag=True,
        help="With --reseed: push everything even from a device away longer than the relay's "
        "tombstone horizon; with --reseed or --adopt: onto a relay restored from a copy older "
        "than a collection run. Either brings back what was deleted and collected.",
    ),
    click.option(
        "--adopt",
        is_flag=True,
        help="After a wipe another device reseeded: pull everything and set aside what the "
        "relay lacks instead of pushing it back.",
    ),
)


@click.command("sync")
@with_options(SYNC_OPTIONS)
@with_options(REJOIN_OPTIONS)
@click.option(
    "--folder",
    type=click.Path(file_okay=False, path_type=Path),
    help="Sync through this folder (default: the one `init`/`join --folder` set).",
)
@click.pass_obj
def sync(
    settings: CliSettings,
    *,
    reseed: bool,
    allow_resurrection: bool,
    adopt: bool,
    trust_account: bool,
    invite: str | None,
    watch: bool,
    idle_sync_s: float,
    retry_for_s: float,
    progress_mode: ProgressMode | None,
    folder: Path | None,
) -> None:
    """Push this device's changes and pull everyone else's."""
    rejoin = rejoin_asked(reseed, allow_resurrection, adopt)
    refuse_invite_without_reseed(invite, rejoin is not None, trust_account)
    path = settings.replica_path
    with user_errors():
        folder = folder or folder_of(path)
    if folder is not None:
        if rejoin is not None:
            raise click.UsageError("--reseed and --adopt are a relay's: a folder keeps all")
        sync_through_folder(settings, folder, watch_s=idle_sync_s if watch else None)
    else:
        sync_through_relay(
            settings, rejoin, trust_account, invite, retry_for_s, progress_mode,
            idle_sync_s if watch else None,
        )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Rejoin:
    """How a device comes back to a wiped or rolled-back relay: `reseed` pushes everything
    (refused from a device away past the tombstone horizon unless `allow_resurrection`);
    `adopt` takes the relay another device reseeded and pushes back nothing it lacks."""

    adopt: bool
    allow_resurrection: bool


def rejoin_asked(reseed: bool, allow_resurrection: bool, adopt: bool) -> Rejoin | None:
    if allow_resurrection and not (reseed or adopt):
        fail("--allow-resurrection is used only with --reseed or --adopt",
             "add --reseed or --adopt", code=ExitCode.USAGE)  # fmt: skip
    if adopt and reseed:
        fail(
            "--adopt and --reseed are two ways back: pick one",
            "--reseed pushes everything here; --adopt takes the relay another device reseeded",
            code=ExitCode.USAGE,
        )
    return Rejoin(adopt, allow_resurrection) if reseed or adopt else None


def sync_through_relay(
    settings: CliSettings,
    rejoin: Rejoin | None,
    trust_account: bool,
    invite: str | None,
    retry_for_s: float,
    progress_mode: ProgressMode | None,
    watch_s: float | None,
) -> None:
    path = settings.replica_path
    with user_errors():
        relay = load_settings(path)  # before the passphrase: a device with no relay fails fast
    with (
        user_errors(),
        opened_replica(path, None if rejoin else settings.passphrase) as replica,
        device_client(path, relay) as client,
        explained_refusals(client, replica, relay.account),
    ):
        proof = None
        if rejoin is not None:
            check_way_back(client, replica, relay.account, adopt=rejoin.adopt,
                           check_reseed=not rejoin.allow_resurrection)  # fmt: skip
            proof = reseed_proof(settings, replica, client, relay, invite, trust_account)

        def once() -> SyncReport:
            return run_sync(
                replica, client, retry_for_s, rejoin=rejoin, auth_key=proof, mode=progress_mode
            )

        report_sync(with_newer_keys(replica, client, settings, relay.account, once))
        after_sync(replica)
        if watch_s is not None:
            backoff = Backoff(max_elapsed_s=retry_for_s)
            watch_live(SyncDriver(replica, client, backoff=backoff), replica, watch_s)


def after_sync(replica: Replica) -> None:
    """What follows a sync: chats a delete elsewhere left with new messages come back, and
    a version-1 account is told its pushes go unsigned."""
    reconcile_chats(replica)
    if not replica.key_generation:
        err.print(f"[yellow]note:[/yellow] {VERSION_1_NOTE}", markup=True)


def reseed_proof(
    settings: CliSettings,
    replica: Replica,
    client: RelayClient,
    relay: RelaySettings,
    invite: str | None,
    trust_account: bool,
) -> bytes:
    """The auth key a reseed is asked with, once access is regained (the account registered
    again, or this device logged in again): Argon2id runs once for the unlock, the login or
    registration and the proof."""
    login = passphrase_login_keys(settings.passphrase(), replica.kdf_params())
    replica.unlock_with_login_keys(login)
    name = relay.device_name or default_device_name()
    reentry = Reentry(relay.account, login, name, settings.recovery_key, invite, trust_account)
    regained = regain_access(client, replica, reentry)
    if regained is not None:
        out.print(REGAINED_MESSAGE[regained].format(account=relay.account, url=relay.url))
    return login.auth_key


VERSION_1_NOTE = (
    "this account's keys are version 1, so its pushes are not signed: a relay that still "
    "takes them lets a stolen device token push in its name; `sealsync upgrade` moves them "
    "to version 2 (it asks for the recovery key once)"
)


def with_newer_keys(
    replica: Replica,
    client: RelayClient,
    settings: CliSettings,
    account: str,
    run: Callable[[], SyncReport],
) -> SyncReport:
    """`run`, and once more after taking the relay's newer keys (upgraded or rotated on
    another device) when a push was refused for keys behind the account's, or versions are
    held for a key epoch this device lacks: only keys the passphrase opens, only newer
    ones, only this account's."""
    try:
        report = run()
    except RelayRefusedError as exc:
        if not needs_newer_keys(exc) or not took_newer_keys(replica, client, settings, account):
            refuse_unsigned(replica, exc)
            raise
    else:
        if not replica.held_for_keys() or not took_newer_keys(replica, client, settings, account):
            return report
    out.print("took the account's newer keys from the relay (changed on another device)")
    rotation = describe_rotation(client, replica)
    if rotation is not None:
        out.print(escape(rotation))  # device names are anyone's text
    return run()


def refuse_unsigned(replica: Replica, exc: RelayRefusedError) -> None:
    """A version-1 account's push refused `forbidden`, with nothing newer to take: the relay
    takes only signed pushes, and the account must be upgraded (specs/protocol.md §4.7)."""
    if exc.code == ErrorCode.FORBIDDEN and not replica.key_generation:
        raise RelayRefusedError(
            exc.status,
            exc.code,
            "this relay takes only signed pushes, and a version-1 account signs none",
            hint="run `sealsync upgrade` on one device (it asks for the recovery key once); "
            "the others take the new keys at their next sync",
        ) from exc


def took_newer_keys(
    replica: Replica, client: RelayClient, settings: CliSettings, account: str
) -> bool:
    """Under the relay's KDF salt: when it is not this replica's, the passphrase was changed
    on another device (a rotation draws a new salt), and the person enters it, even when a
    rotation kept it (`devices --revoke --keep-passphrase`): a bundle the passphrase this
    device holds opens could be a revoked device's forgery, for it knows that one too
    (docs/key-generations.md §7)."""
    kdf = client.prelogin(account).kdf
    changed = kdf != replica.kdf_params()
    passphrase = settings.changed_passphrase() if changed else settings.passphrase()
    took = adopt_relay_keys(client, replica, passphrase_login_keys(passphrase, kdf))
    if took:
        replace_remembered(settings.replica_path, passphrase)
    return took


def refuse_invite_without_reseed(invite: str | None, reseed: bool, trust: bool) -> None:
    """--invite given on the command line without --reseed is a usage error (exit 2);
    SEALSYNC_INVITE in the environment stays a standing setting. So is --trust-account."""
    if trust and not reseed:
        fail("--trust-account is used only with --reseed", "add --reseed", code=ExitCode.USAGE)
    given = click.get_current_context().get_parameter_source("invite")
    if invite is not None and not reseed and given is click.core.ParameterSource.COMMANDLINE:
        fail(
            "--invite is used only by a reseed that registers a lost account again",
            "add --reseed if the relay lost this account; otherwise leave --invite out",
            code=ExitCode.USAGE,
        )


def watch_live(driver: SyncDriver, replica: Replica, idle_sync_s: float) -> None:
    """Sync on every change until SIGINT or SIGTERM: either ends the watch cleanly (exit 0),
    after the round in progress, so a service manager's stop never cuts a merge short. Each
    round ends as a one-off sync does: chats a delete elsewhere left with new messages come
    back."""
    stop = threading.Event()

    def report_and_reconcile(report: SyncReport) -> None:
        report_round(report)
        reconcile_chats(replica)

    out.print("watching for changes (Ctrl-C stops)")
    with stopped_by_signals(stop):
        try:
            driver.watch(stop, idle_sync_s=idle_sync_s, on_report=report_and_reconcile)
        except RollbackError as exc:
            fail(f"{exc}", rollback_hint(exc))
    out.print("stopped watching")


def run_sync(
    replica: Replica,
    client: RelayClient,
    retry_for_s: float,
    *,
    rejoin: Rejoin | None = None,
    auth_key: bytes | None = None,
    mode: ProgressMode | None = None,
) -> SyncReport:
    """One sync round, or the way back to a wiped relay `rejoin` asks for (a reseed is
    asked for with the account's `auth_key`), showing progress as `mode` says (by default:
    bars on a terminal); a rollback stops with its finding."""
    backoff = Backoff(max_elapsed_s=retry_for_s)
    with shown_progress(mode or default_mode(err), err) as on_progress:
        driver = SyncDriver(replica, client, progress=on_progress, backoff=backoff)
        try:
            if rejoin is None:
                return driver.sync()
            if rejoin.adopt:
                return driver.adopt(allow_resurrection=rejoin.allow_resurrection)
            assert auth_key is not None, "a reseed is asked for with the auth key"
            return driver.reseed(auth_key, allow_resurrection=rejoin.allow_resurrection)
        except RollbackError as exc:
            fail(f"{exc}", rollback_hint(exc))
