"""The device's relay settings, kept in a sidecar file next to its replica.

`<replica>.relay.json` holds the relay URL, the account name, whether plain http to a remote
host was allowed, and the device's current session (its tokens). The tokens are as good as a
login, so the file is mode 0600 and replaced atomically (temp file, fsync, rename): a crash
mid-write leaves the old session or the new one, never half of each — a refresh token works
only once, so losing the new one would lock the device out.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from clients.http import RelayClient
from replica import Replica, ReplicaOptions
from replica.errors import StoreError
from replica.wire import Session

T = TypeVar("T")

SIDECAR_SUFFIX = ".relay.json"
FOLDER_STATE_SUFFIX = ".folder.json"
"""Beside a replica that syncs through a folder: which, and what of it is merged."""
FOLDER_LOCK_SUFFIX = ".folder.lock"
"""Beside it too: the OS lock that keeps two rounds on one replica from overlapping."""
CLI_OPTIONS = ReplicaOptions(freshness_window_s=0)
"""A command's write has no screen to protect from an inbound version arriving moments later
(what freshness locks are for, docs/architecture.md §5): with the window off, `sync` shows a concurrent
edit as a conflict at once instead of holding it for ten seconds."""
FILE_MODE = 0o600


def sidecar_path(replica_path: Path) -> Path:
    return replica_path.with_name(replica_path.name + SIDECAR_SUFFIX)


@dataclass(frozen=True)
class RelaySettings:
    """Where and as whom this device syncs; `session` is None until it registered or logged in."""

    url: str
    account: str
    insecure: bool = False
    session: Session | None = None
    device_name: str | None = None
    """The name the relay lists this device under: a reseed registers it again under it, so
    the other devices name it right when they ask whether to trust it."""
    cacert: str | None = None
    """A CA certificate (PEM, an absolute path) the relay's TLS is verified with instead of
    the system's: a relay behind a proxy with a self-signed certificate."""

    def __repr__(self) -> str:  # the session's tokens never reach a repr
        return f"RelaySettings(url={self.url!r}, account={self.account!r})"

    def with_session(self, session: Session) -> RelaySettings:
        return replace(self, session=session)


def settings_to_json(settings: RelaySettings) -> bytes:
    value: dict[str, Any] = {
        "url": settings.url,
        "account": settings.account,
        "insecure": settings.insecure,
        "session": msgspec.to_builtins(settings.session),
        "device_name": settings.device_name,
        "cacert": settings.cacert,
    }
    return json.dumps(value, indent=2).encode() + b"\n"


def settings_from_json(data: bytes, path: Path) -> RelaySettings:
    try:
        value = json.loads(data)
        session = value.get("session")
        return RelaySettings(
            url=str(value["url"]),
            account=str(value["account"]),
            insecure=bool(value.get("insecure", False)),
            session=None if session is None else msgspec.convert(session, Session),
            device_name=_optional_str(value.get("device_name")),
            cacert=_optional_str(value.get("cacert")),
        )
    except (ValueError, KeyError, TypeError, AttributeError, msgspec.ValidationError) as exc:
        raise StoreError(
            f"{path} is not a sealsync relay settings file ({type(exc).__name__})",
            hint="remove it and run `sealsync join` for this device again",
        ) from exc


def _optional_str(value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(type(value).__name__)
    return value


def load_settings(replica_path: Path) -> RelaySettings:
    """The settings saved by `init` or `join`; a clear error when there are none."""
    path = sidecar_path(replica_path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise StoreError(
            f"no relay settings for {replica_path} (looked for {path})",
            hint="this replica was not made by `sealsync init` or `sealsync join`; a replica "
            "restored from a backup: `sealsync login --relay URL --account NAME`",
        ) from None
    return settings_from_json(data, path)


def save_settings(replica_path: Path, settings: RelaySettings) -> None:
    """Replace the sidecar atomically with mode 0600, so no reader sees half a file."""
    write_atomically(sidecar_path(replica_path), settings_to_json(settings))


def read_sidecar(path: Path, kind: type[T], what: str, hint: str) -> T | None:
    """The JSON file `path` beside a replica as `kind`, its fields' types checked; None
    when there is none; `StoreError` naming it (as not `what`) when it holds anything else."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=kind)
    except FileNotFoundError:
        return None
    except msgspec.DecodeError as exc:  # a ValidationError too
        raise StoreError(f"{path} is not {what}: {exc}", hint=hint) from None


def write_atomically(path: Path, data: bytes, *, over: bool = True) -> None:
    """Write `data` as `path`, owner-only, whole or not at all, durable before this returns:
    through a hidden temporary file (`.NAME.XXXX.tmp`) beside it, fsynced, then renamed over
    `path` — or, not `over`, put in place only if no file is there (`FileExistsError`)."""
    folder = path.parent
    descriptor, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    temp = Path(name)
    try:
        os.fchmod(descriptor, FILE_MODE)
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        if over:
            os.replace(temp, path)
        else:
            _put_in_place(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    fsync_folder(folder)


def _put_in_place(temp: Path, target: Path) -> None:
    """Give `temp` the name `target`, never over a file already there: a hard link where
    the file system has them, else (FAT, exFAT) a rename once no such file exists (for a
    file with one writer at a time)."""
    try:
        os.link(temp, target)
    except FileExistsError:
        raise
    except OSError:  # no hard links here
        if target.exists():
            raise FileExistsError(target) from None
        os.rename(temp, target)


def fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable (POSIX: the directory entry needs its own fsync)."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class SessionSaver:
    """`RelayClient.on_session`: every new session (login, refresh) is saved at once."""

    def __init__(self, replica_path: Path, settings: RelaySettings) -> None:
        self.replica_path = replica_path
        self.settings = settings

    def __call__(self, session: Session) -> None:
        self.settings = self.settings.with_session(session)
        save_settings(self.replica_path, self.settings)


def device_client(replica_path: Path, settings: RelaySettings) -> RelayClient:
    """A client for the device's relay, with its saved session, saving the ones to come and
    taking a newer one another process saved (`sync --watch` beside a one-off command)."""
    return client_for(
        settings,
        session=settings.session,
        on_session=SessionSaver(replica_path, settings),
        saved_session=lambda: saved_session(replica_path),
    )


def client_for(relay: RelaySettings, **options: Any) -> RelayClient:
    """A client of `relay`, trusting what its settings say (plain http, a CA of its own)."""
    return RelayClient(relay.url, insecure=relay.insecure, ca_file=relay.cacert, **options)


def saved_session(replica_path: Path) -> Session | None:
    """The session in the sidecar now, or None when it cannot be read (the client then
    refreshes its own)."""
    try:
        return load_settings(replica_path).session
    except StoreError:
        return None


def refuse_existing(replica_path: Path) -> None:
    """`init` and `join` make a replica; one already at the path is never overwritten."""
    if replica_path.exists():
        raise StoreError(
            f"{replica_path} already exists",
            hint="give another path with --replica (or SEALSYNC_REPLICA)",
        )


@contextmanager
def removed_on_failure(replica_path: Path) -> Iterator[None]:
    """Remove the replica and sidecar made inside, if anything inside fails: a half-made
    device (a replica the relay never heard of) would only confuse the next attempt."""
    try:
        yield
    except BaseException:
        sidecars = (SIDECAR_SUFFIX, FOLDER_STATE_SUFFIX, FOLDER_LOCK_SUFFIX)
        for suffix in ("", "-wal", "-shm", "-journal", *sidecars):
            replica_path.with_name(replica_path.name + suffix).unlink(missing_ok=True)
        raise


@contextmanager
def opened_replica(
    replica_path: Path, passphrase: Callable[[], str] | None = None
) -> Iterator[Replica]:
    """The replica, unlocked with `passphrase()` when given (asked only once the file opened,
    so a wrong path is reported before anyone types a secret); closed afterwards."""
    replica = Replica.open(replica_path, options=CLI_OPTIONS)
    try:
        if passphrase is not None:
            replica.unlock(passphrase())
        yield replica
    finally:
        replica.close()
