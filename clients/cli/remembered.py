"""The passphrase kept in the OS keyring, so that an unattended `sync --watch` or a script
needs none in its environment (docs/key-generations.md §7; `keyring` is optional:
`pip install 'sealsync[keyring]'`).

One entry per replica file: service `sealsync`, user the file's absolute path. It is read
after `--passphrase-file` and SEALSYNC_PASSPHRASE and before a prompt (`CliSettings`); a
passphrase change made on this device (`passwd`, a revoke, or taking keys changed on another
device) replaces it, so the file and its entry never part. `sealsync keyring store` makes it
and `sealsync keyring forget` removes it. Without `keyring`, or without a keyring service
(a headless server), nothing is read and `store` says why.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import click
from rich.markup import escape

from clients.cli.console import err, out, user_errors
from clients.device import opened_replica
from replica.errors import InvalidArgumentError

if TYPE_CHECKING:  # settings reads the keyring: imported at run time, it would be a cycle
    from clients.cli.settings import CliSettings

SERVICE = "sealsync"


def _keyring() -> ModuleType | None:
    """The `keyring` package, when installed (it is optional)."""
    try:
        return importlib.import_module("keyring")
    except ImportError:
        return None


def _user(path: Path) -> str:
    return str(path.resolve())


def remembered(path: Path) -> str | None:
    """The passphrase the keyring keeps for this replica file, if any can be read. None for
    a file that is not there: an entry left by a file since deleted is stale, and must not
    make or join an account with an old passphrase at the same path."""
    keyring = _keyring()
    if keyring is None or not path.exists():
        return None
    try:
        found: str | None = keyring.get_password(SERVICE, _user(path))
    except Exception:  # backends raise their own (macOS api.Error, pywintypes.error)
        return None  # no keyring to read is a prompt, never a failed command
    return found


def remember(path: Path, passphrase: str) -> None:
    keyring = _keyring()
    if keyring is None:
        raise InvalidArgumentError(
            "the OS keyring needs the `keyring` package",
            hint="pip install 'sealsync[keyring]'; or give the passphrase in a file "
            "(--passphrase-file) or in SEALSYNC_PASSPHRASE",
        )
    try:
        keyring.set_password(SERVICE, _user(path), passphrase)
    except Exception as exc:  # backends raise their own, not only KeyringError
        raise InvalidArgumentError(
            f"the OS keyring refused the passphrase: {exc}",
            hint="a server without a keyring service can keep it in a file readable only "
            "by its user (--passphrase-file)",
        ) from exc


def replace_remembered(path: Path, passphrase: str) -> None:
    """After a passphrase change here: the keyring's entry, if there is one, follows it. A
    keyring that refuses is a warning, not an error: the change itself is done."""
    if remembered(path) is None:
        return
    try:
        remember(path, passphrase)
    except InvalidArgumentError as exc:
        err.print(
            f"[yellow]warning:[/yellow] {escape(str(exc))}: the OS keyring keeps the old "
            "passphrase; `sealsync keyring forget`, then `keyring store`",
            markup=True,
        )


def forget_remembered(path: Path) -> bool:
    """Remove this replica file's entry; whether there was one."""
    keyring = _keyring()
    if keyring is None:
        return False
    try:
        keyring.delete_password(SERVICE, _user(path))
    except Exception:  # PasswordDeleteError when there is none; backends raise their own
        return False
    return True


@click.group("keyring")
def keyring_group() -> None:
    """Keep this replica's passphrase in the OS keyring, or forget it."""


@keyring_group.command("store")
@click.pass_obj
def store(settings: CliSettings) -> None:
    """Keep the passphrase (checked: it must unlock this replica) in the OS keyring."""
    path = settings.replica_path
    with user_errors(), opened_replica(path) as replica:
        passphrase = settings.passphrase()
        replica.unlock(passphrase)  # a wrong one is refused before it is kept
        remember(path, passphrase)
    out.print(f"the OS keyring keeps the passphrase of {path}")


@keyring_group.command("forget")
@click.pass_obj
def forget(settings: CliSettings) -> None:
    """Remove this replica's passphrase from the OS keyring."""
    path = settings.replica_path
    if forget_remembered(path):
        out.print(f"the OS keyring no longer keeps the passphrase of {path}")
    else:
        out.print(f"the OS keyring keeps no passphrase of {path}")
