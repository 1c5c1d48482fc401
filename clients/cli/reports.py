"""How a sync round through a relay is reported: one line on stdout, then, on stderr,
what needs the person, and the exit code it earns (specs/cli.md §2)."""

from __future__ import annotations

import datetime
import sys

from clients.cli.console import ExitCode, err, fail, out, print_error
from clients.sync import SyncReport
from replica import ErrorCode

PAUSED_WARNING = (
    "needs the new passphrase: the account's keys changed on another device. Pulling only; "
    "this device's writes are kept and go out once `sealsync sync` (which asks for it) "
    "takes the new keys; then start the watch again"
)


def report_round(report: SyncReport) -> None:
    """One line per round, with the time, so a terminal left open shows when it last synced."""
    moment = datetime.datetime.now().strftime("%H:%M:%S")
    out.print(
        f"{moment} synced: {report.pushed} pushed, {report.pulled} pulled, "
        f"{report.merged} merged" + (f", {report.refused} refused" if report.refused else "")
    )
    if report.unconfirmed:
        err.print(UNCONFIRMED_WARNING.format(n=report.unconfirmed), markup=True)
    if report.quarantined:
        err.print(
            f"[yellow]warning:[/yellow] {report.quarantined} pulled version(s) could not be "
            f"opened and are in quarantine; {QUARANTINED_HINT}",
            markup=True,
        )
    if report.untrusted:
        message = UNTRUSTED_MESSAGE.format(n=report.untrusted)
        err.print(f"[yellow]warning:[/yellow] {message}; {UNTRUSTED_HINT}", markup=True)
    if report.pushing_paused:
        err.print(f"[yellow]warning:[/yellow] {PAUSED_WARNING}", markup=True)
    report_resync(report)


def report_resync(report: SyncReport) -> None:
    """What a full resync did, when the relay asked for one and it changed anything here
    (a device that joins after a run resyncs too, from nothing)."""
    done = report.resynced
    if done is None or not (done.dropped or done.set_aside):
        return
    err.print(
        "[yellow]note:[/yellow] the relay deleted records for good while this device was "
        f"away, so it pulled everything again: {done.dropped} version(s) deleted meanwhile "
        f"are gone here too, {done.set_aside} set aside (kept here, neither merged nor "
        "pushed: they may be writes another device deleted; `sealsync status` counts them "
        "under held)",
        markup=True,
    )


REFUSAL_HINTS: dict[ErrorCode, str] = {
    ErrorCode.CLOCK_AHEAD: "this device's clock is ahead of the relay's: set it right (NTP), "
    "then sync",
    ErrorCode.TOO_LARGE: "a record is over the relay's max_envelope_bytes: make it smaller",
    ErrorCode.IDENTITY_CONFLICT: "another copy of this replica wrote as this device: "
    "`sealsync restore` a backup (it takes a new node id), or sync from a fresh `sealsync join`",
    ErrorCode.MALFORMED: "the relay could not read them: report it with `sealsync status --json`",
}


UNCONFIRMED_WARNING = (
    "[yellow]warning:[/yellow] the relay called {n} version(s) superseded but has not sent "
    "what supersedes them; they stay to be pushed (a relay that drops writes, or a newer "
    "version held here)"
)


QUARANTINED_HINT = (
    "`sealsync diagnose` shows what cannot be opened; `sealsync repair` keeps it in quarantine "
    "and lets its records be read and written again"
)


UNTRUSTED_MESSAGE = (
    "{n} pulled version(s) were sealed under key epochs a rotation retired, beyond its "
    "frontier: made with a revoked device's keys. They were refused and changed no record"
)
UNTRUSTED_HINT = (
    "`sealsync diagnose` lists them (kept in quarantine); whoever could put them on the relay "
    "holds a revoked device's keys"
)


def report_sync(report: SyncReport) -> None:
    """The round's line; then, on stderr, what needs the user, and the exit code it earns."""
    refused = f", {report.refused} refused" if report.refused else ""
    set_aside = "".join(
        f", {n} {what}"
        for n, what in (
            (report.held, "held"),
            (report.quarantined, "quarantined"),
            (report.untrusted, "untrusted"),
        )
        if n
    )
    out.print(
        f"synced: {report.pushed} pushed ({report.stored} stored{refused}), "
        f"{report.pulled} pulled, {report.merged} merged{set_aside}"
    )
    if report.unconfirmed:
        err.print(UNCONFIRMED_WARNING.format(n=report.unconfirmed), markup=True)
    if report.refused:
        codes = sorted(report.refused_by_code.items())
        hints = [REFUSAL_HINTS[code] for code, _ in codes if code in REFUSAL_HINTS]
        message = (
            f"the relay refused {report.refused} version(s) "
            f"({', '.join(f'{n} {code}' for code, n in codes)}); they stay to be pushed again"
        )
        hint = "; ".join(hints) or None
        if not (report.quarantined or report.untrusted):
            fail(message, hint)
        print_error(message, hint)  # and exit 3 below
    report_resync(report)
    report_set_aside(report)


def report_set_aside(report: SyncReport) -> None:
    """What was pulled but could not be merged, and exit 3 if anything was."""
    if report.untrusted:
        print_error(UNTRUSTED_MESSAGE.format(n=report.untrusted), UNTRUSTED_HINT)
    if report.quarantined:
        print_error(
            f"{report.quarantined} pulled version(s) could not be opened: kept verbatim in "
            "quarantine, and their records refuse reads and writes",
            QUARANTINED_HINT,
        )
    if report.untrusted or report.quarantined:
        sys.exit(ExitCode.DAMAGED)
