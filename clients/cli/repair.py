"""`diagnose` and `repair`: the replica's unreadable rows, shown and then set aside;
`compact`, which gives the file's free pages back to the disk; and `aside`, what a full
resync set aside, listed or taken back.

`diagnose` opens every stored version with the account's keys and names what cannot be opened
(corrupt: malformed or in the wrong row; undecryptable: it does not authenticate), changing
nothing. `repair` moves those rows, byte for byte, into the quarantine table and lifts the
degraded latch, so the rest of their records can be read and written again; it refuses when
most rows are undecryptable (a wrong key, not damage) unless `--force` (specs/replica.md §7).
"""

from __future__ import annotations

import json

import click
from rich.table import Table

from clients.cli.console import ExitCode, fail, out, user_errors
from clients.cli.settings import CliSettings
from clients.device import opened_replica
from clients.folder import forget_merged
from replica import DEFAULT_PROFILE, Diagnosis

SHOWN_FINDINGS = 50
"""Findings listed in the table; `--json` lists them all."""


def diagnosis_to_json(diagnosis: Diagnosis) -> str:
    findings = [
        {
            "table": f.table,
            "key": f.row.key.hex(),
            "node": f"{f.row.node:016x}",
            "hlc": f.row.hlc,
            "damage": f.damage,
            "reason": f.reason,
        }
        for f in diagnosis.findings
    ]
    fields = {
        "healthy": diagnosis.healthy,
        "rows": diagnosis.rows,
        "corrupt": diagnosis.corrupt,
        "undecryptable": diagnosis.undecryptable,
        "degraded_records": diagnosis.degraded_records,
        "findings": findings,
    }
    return json.dumps(fields, sort_keys=True)


def print_diagnosis(diagnosis: Diagnosis) -> None:
    out.print(
        f"{diagnosis.rows} rows: {diagnosis.corrupt} corrupt, {diagnosis.undecryptable} "
        f"undecryptable; {diagnosis.degraded_records} degraded record(s)"
    )
    if not diagnosis.findings:
        return
    table = Table("table", "opaque key", "damage", "reason")
    for finding in diagnosis.findings[:SHOWN_FINDINGS]:
        table.add_row(finding.table, finding.row.key.hex(), finding.damage, finding.reason)
    out.print(table)
    if len(diagnosis.findings) > SHOWN_FINDINGS:
        out.print(f"… and {len(diagnosis.findings) - SHOWN_FINDINGS} more (--json lists all)")


@click.command("diagnose")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_obj
def diagnose(settings: CliSettings, as_json: bool) -> None:
    """Open every stored version and name those that cannot be opened (changes nothing).
    Exits 3 when it finds any."""
    with user_errors(), opened_replica(settings.replica_path, settings.passphrase) as replica:
        diagnosis = replica.diagnose()
    if as_json:
        click.echo(diagnosis_to_json(diagnosis))
    else:
        print_diagnosis(diagnosis)
    if not diagnosis.healthy:
        fail(
            "the replica holds data that cannot be opened",
            "`sealsync repair` keeps it in quarantine and lets its records be used again",
            code=ExitCode.DAMAGED,
        )


@click.command("repair")
@click.option("--force", is_flag=True, help="Repair even when most rows are undecryptable.")
@click.pass_obj
def repair(settings: CliSettings, force: bool) -> None:
    """Move unreadable rows, verbatim, to quarantine and let their records be used again."""
    with user_errors(), opened_replica(settings.replica_path, settings.passphrase) as replica:
        report = replica.repair(force=force)
        forget_merged(settings.replica_path)  # a folder's files are read again, as a relay's
    out.print(
        f"repaired: {report.quarantined} row(s) quarantined, "
        f"{report.unlatched_records} record(s) readable again, "
        f"{report.readmitted} quarantined version(s) opened and merged again"
    )


@click.command("compact")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_obj
def compact(settings: CliSettings, as_json: bool) -> None:
    """Rewrite the replica file without its free pages (deleted records and collected
    tombstones leave them): no passphrase needed; other processes' writes wait meanwhile."""
    with user_errors(), opened_replica(settings.replica_path) as replica:
        compacted = replica.compact()
    if as_json:
        out.print_json(json.dumps({"before": compacted.before, "after": compacted.after}))
        return
    out.print(
        f"compacted: {compacted.before} bytes before, {compacted.after} after "
        f"({compacted.before - compacted.after} given back to the disk)"
    )


@click.command("aside")
@click.option(
    "--take",
    nargs=2,
    metavar="COLLECTION ID",
    help="Write this record's version set aside back as a new version (it then syncs).",
)
@click.option("--profile", default=DEFAULT_PROFILE, show_default=True, help="With --take.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_obj
def aside(settings: CliSettings, take: tuple[str, str] | None, profile: str, as_json: bool) -> None:
    """List the versions a full resync set aside: writes of this device the relay may have
    stored before another device deleted them for good, kept here, neither merged nor
    pushed. `--take COLLECTION ID` brings one back."""
    with user_errors(), opened_replica(settings.replica_path, settings.passphrase) as replica:
        if take is not None:
            replica.take_aside(*take, profile=profile)
            out.print(f"took back {take[0]}/{take[1]}: it syncs as a new version")
            return
        versions = replica.set_aside()
    if as_json:
        out.print_json(json.dumps([vars(v) for v in versions]))
        return
    table = Table("profile", "collection", "id", "deleted", "document")
    for v in versions:
        document = "" if v.deleted else json.dumps(v.document)[:60]
        table.add_row(v.profile, v.collection, v.id, "yes" if v.deleted else "", document)
    out.print(table if versions else "nothing is set aside")
