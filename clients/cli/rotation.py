"""What the commands that change an account's keys share, relay or folder: the passphrase a
rotation goes to, a new recovery key shown before anything is sent, and dates as shown."""

from __future__ import annotations

import datetime
import os

from clients.cli.console import err
from clients.cli.settings import CliSettings
from replica.errors import InvalidArgumentError
from replica.keys import format_recovery_key


def created_to_text(created_ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(created_ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


KEPT_PASSPHRASE_WARNING = (
    "the passphrase stays: if the revoked device still works and its holder knows the "
    "passphrase, they can open the new keys and read what is written next; the other "
    "devices ask for the account's passphrase once (enter the same one)"
)


def rotation_passphrase(settings: CliSettings, old: str, keep: bool) -> str:
    """The passphrase a revoke rotates to: a new one, unless `keep` (with a warning)."""
    if keep:
        err.print(f"[yellow]warning:[/yellow] {KEPT_PASSPHRASE_WARNING}", markup=True)
        return old
    new = settings.new_passphrase()
    if new == old:
        raise InvalidArgumentError(
            "the new passphrase is the current one, which the revoked device may know",
            hint="choose a different passphrase (or --keep-passphrase for a device known "
            "to be destroyed); nothing was changed",
        )
    return new


def shown_recovery_key() -> str:
    """A new recovery key, shown before the revoke is sent: should its answer be lost, the
    relay may hold generation g + 1 wrapped to it all the same."""
    recovery_key = format_recovery_key(os.urandom(32))
    err.print("new recovery key (it replaces the old one once the revoke succeeds; keep it):")
    err.print(recovery_key)
    return recovery_key
