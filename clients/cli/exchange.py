"""`export` and `import` (chat/exchange.py, specs/chat.md §9): a profile's chats, or one
chat, as decrypted JSON (every profile as a zip archive), and such files brought in under
hard ceilings, never replacing or deleting anything here."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.markup import escape

from chat.archive import read_archive, write_archive
from chat.exchange import ImportReport, export_profile, import_export
from chat.limits import MAX_FILE_BYTES, ReadExport, decode, refuse
from clients.cli.chat import chat_store
from clients.cli.console import err, out, user_errors
from clients.cli.records import json_option, print_json
from clients.cli.settings import CliSettings
from clients.device import write_atomically
from replica import DEFAULT_PROFILE

ZIP_MAGIC = b"PK\x03\x04"


@click.command("export")
@click.option(
    "--to",
    "target",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write here, readable by you alone (default: standard output).",
)
@click.option("--profile", default=DEFAULT_PROFILE, show_default=True, help="The profile.")
@click.option("--chat", "thread", help="Only this chat.")
@click.option("--all-profiles", is_flag=True, help="Every profile, as a zip archive.")
@click.pass_obj
def export(
    settings: CliSettings, target: Path | None, profile: str, thread: str | None, all_profiles: bool
) -> None:
    """Write chats as decrypted JSON: a profile's, one chat, or (a zip) every profile's.
    Drafts stay on this device; the file holds plaintext: keep it safe."""
    if all_profiles and thread is not None:
        raise click.UsageError("--chat exports one chat of one profile: leave --all-profiles out")
    if all_profiles and target is None:
        raise click.UsageError("--all-profiles writes a zip archive: give --to FILE")
    with chat_store(settings, profile) as store:
        replica = store.replica
        if all_profiles:
            profiles = enumerate(replica.profiles())
            data = write_archive(
                {f"profile-{i:04d}.json": export_profile(replica, p) for i, p in profiles}
            )
        else:
            data = export_profile(replica, profile, thread=thread)
        if target is None:
            sys.stdout.buffer.write(data)
            return
        write_atomically(target, data)  # owner-only, whole or not at all
    err.print(f"exported to {target} ({len(data):,} bytes of plaintext: keep it safe)")


@click.command("import")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--profile", default=None, help="Import into this profile (default: the file's).")
@click.option("--as-copies", is_flag=True, help="Import records that differ here as copies.")
@json_option
@click.pass_obj
def import_(
    settings: CliSettings, file: Path, profile: str | None, as_copies: bool, as_json: bool
) -> None:
    """Bring in an export (or a zip of them), read under hard ceilings: nothing here is
    replaced or deleted; identical records are skipped, differing ones named and left
    (or, --as-copies, imported under new ids). Importing a file twice changes nothing."""
    with user_errors():
        reads = read_exports(file)  # every file checked before anything is written
    reports: list[tuple[str, ImportReport]] = []
    with chat_store(settings, profile or DEFAULT_PROFILE) as store, store.replica.batch():
        for read in reads:
            into = profile or read.profile
            report = import_export(store.replica, read, profile=into, as_copies=as_copies)
            reports.append((into, report))
    if as_json:
        print_json([report_json(into, report) for into, report in reports])
        return
    for into, report in reports:
        print_report(into, report)


def read_exports(file: Path) -> list[ReadExport]:
    """The exports in `file` (an export, or a zip archive of them), each checked."""
    size = file.stat().st_size
    if size > MAX_FILE_BYTES:
        raise refuse(str(file), f"{size:,} bytes (bound {MAX_FILE_BYTES:,})")
    data = file.read_bytes()
    if data.startswith(ZIP_MAGIC):
        return [decode(entry) for _, entry in sorted(read_archive(data).items())]
    return [decode(data)]


def report_json(profile: str, report: ImportReport) -> dict[str, object]:
    return {
        "profile": profile,
        "added": dict(report.added),
        "identical": dict(report.identical),
        "copied": dict(report.copied),
        "differing": report.differing,
    }


def print_report(profile: str, report: ImportReport) -> None:
    def counts(counter: dict[str, int]) -> str:
        return ", ".join(f"{n} {kind}(s)" for kind, n in sorted(counter.items())) or "nothing"

    out.print(f"imported into profile {escape(profile)!r}: {counts(report.added)} added")
    out.print(f"  identical here, skipped: {counts(report.identical)}")
    if report.copied:
        out.print(f"  imported as copies: {counts(report.copied)}")
    for differing in report.differing:
        err.print(
            f"[yellow]warning:[/yellow] {escape(differing)} differs from the one here: left "
            "(--as-copies imports it as a copy)",
            markup=True,
        )
