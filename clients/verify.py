"""Checking backups: without the passphrase, and with it (`sealsync backup verify [--read-data]`).

A backup is good when its manifest reads back whole, names its file, and the file has the
size and SHA-256 the manifest says, passes SQLite's `integrity_check`, is a replica of the
format the manifest says, holds the rows it says, and every envelope's header parses,
belongs to its row, and has the SHA-256 the manifest says (so damage is named by row).
Anything else is damage, named; a file that cannot be read at all (no permission) is
unreadable. In a folder, a backup file without its manifest, a manifest without its file,
and any other file are damage too: a set that was cut short or changed.
"""

from __future__ import annotations

import hashlib
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from clients.manifest import (
    COUNTED_TABLES,
    Manifest,
    file_digest,
    manifest_path,
    read_manifest,
    row_name,
)
from clients.rowdigests import (
    DIGESTED_TABLES,
    Position,
    ordered_rows,
    read_row_digests,
    rows_path,
)
from replica import Replica, copy_replica_file
from replica.errors import ProtocolError, StoreError, WrongKeyError
from replica.files import read_only_uri
from replica.migrations import APPLICATION_ID
from replica.wire import node_from_i64, parse_header

State = Literal["ok", "damaged", "wrong_key", "unreadable"]
MAX_NAMED = 20
"""Damaged rows named one by one; past that, counted."""


@dataclass(frozen=True)
class Verdict:
    backup: Path
    state: State
    problems: tuple[str, ...]


def verify_folder(folder: Path, check: Callable[[Path], Verdict] | None = None) -> list[Verdict]:
    """A verdict for each backup in `folder` (by `check`, else `verify_backup`), and one for
    each file that is no part of one."""
    check = check or verify_backup
    if not folder.is_dir():
        raise StoreError(f"no folder {folder}", hint="give the folder given to `backup --to`")
    verdicts = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or path.is_dir():
            continue  # a copy in progress (temporary names begin with a dot), or a folder
        if path.suffix == ".db":
            verdicts.append(check(path))
        elif path.suffix in (".json", ".rows") and not path.with_suffix(".db").exists():
            verdicts.append(
                Verdict(path, "damaged", ("the backup file of this manifest is missing",))
            )
        elif path.suffix not in (".json", ".rows"):
            verdicts.append(Verdict(path, "damaged", ("a file that is no part of a backup",)))
    return verdicts


def verify_backup(backup: Path) -> Verdict:
    try:
        problems = list(_problems(backup))
    except OSError as exc:
        return Verdict(backup, "unreadable", (str(exc),))
    except (ValueError, TypeError, RecursionError) as exc:  # what damaged JSON or rows raise
        return Verdict(backup, "damaged", (f"could not be checked: {exc}",))
    return Verdict(backup, "damaged" if problems else "ok", tuple(problems))


def verify_with_key(backup: Path, passphrase: Callable[[], str]) -> Verdict:
    """`verify_backup`, then, for a backup that passes it, every envelope opened with the
    account's keys (`Replica.diagnose`), in a temporary copy: opening a file as a replica
    writes to it, and a backup must stay as it was written. `passphrase()` is asked once a
    backup has passed the check without it; `wrong_key` when it does not open the backup."""
    verdict = verify_backup(backup)
    if verdict.state != "ok":
        return verdict
    with tempfile.TemporaryDirectory(prefix="sealsync-verify-") as folder:
        copy = Path(folder) / backup.name
        copy_replica_file(backup, copy, read_only=True)
        with Replica.open(copy) as replica:
            try:
                replica.unlock(passphrase())
            except WrongKeyError as exc:
                return Verdict(backup, "wrong_key", (str(exc),))
            diagnosis = replica.diagnose()
    problems = [
        f"{f.table} row {row_name(f.row.key, f.row.node, f.row.hlc)} is {f.damage}: {f.reason}"
        for f in diagnosis.findings
    ]
    if len(problems) > MAX_NAMED:
        problems[MAX_NAMED:] = [f"and {len(problems) - MAX_NAMED} more damaged rows"]
    return Verdict(backup, "damaged" if problems else "ok", tuple(problems))


def _problems(backup: Path) -> Iterator[str]:
    if not backup.is_file():
        yield "the backup file is missing"
        return
    try:
        manifest = read_manifest(manifest_path(backup))
    except FileNotFoundError:
        yield "no manifest: the backup was cut short, or its manifest removed"
        return
    except StoreError as exc:
        yield str(exc)
        return
    if manifest.file != backup.name:
        yield f"the manifest is {manifest.file}'s, not this file's"
        return
    size, digest = file_digest(backup)
    if (size, digest) != (manifest.bytes, manifest.sha256):
        yield f"the file is not what was written ({size} bytes, SHA-256 {digest[:16]}…)"
    yield from _database_problems(backup, manifest)


def _database_problems(backup: Path, manifest: Manifest) -> Iterator[str]:
    try:
        with closing(sqlite3.connect(read_only_uri(backup) + "&immutable=1", uri=True)) as db:
            check = [r[0] for r in db.execute("PRAGMA integrity_check(20)")]
            if check != ["ok"]:
                yield f"integrity_check: {'; '.join(check)}"
                return
            if db.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
                yield "not a sealsync replica"
                return
            found = db.execute("PRAGMA user_version").fetchone()[0]
            if found != manifest.replica_format:
                yield f"replica format {found}, the manifest says {manifest.replica_format}"
            for table in COUNTED_TABLES:
                count = db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                if count != (said := manifest.rows.get(table)):
                    yield f"{table} holds {count} rows, the manifest says {said}"
            yield from _row_problems(db, backup, manifest)
            yield from _held_problems(db)
    except sqlite3.DatabaseError as exc:
        yield f"not a readable SQLite file: {exc}"


def _row_problems(db: sqlite3.Connection, backup: Path, manifest: Manifest) -> Iterator[str]:
    """Every envelope's header parses and names its row (key, node, hlc), and every row is
    the one the row digests name, with the envelope it had: what differs is named, by row.
    The rows and the digests are walked side by side in one order, never held at once."""
    digests = rows_path(backup)
    if manifest.envelopes is None:
        try:
            if file_digest(digests)[1] != manifest.rows_sha256:
                yield f"{digests.name} is not what was written (its SHA-256 differs)"
                return
        except FileNotFoundError:
            yield f"{digests.name}, the digests of the backup's rows, is missing"
            return
    damaged = Tally()
    for table in DIGESTED_TABLES:
        expected = (
            read_row_digests(digests, table)
            if manifest.envelopes is None
            else _in_order(manifest.envelopes.get(table, {}))
        )
        _walk(table, ordered_rows(db, table), expected, damaged)
    yield from damaged.named
    if damaged.more:
        yield f"and {damaged.more} more damaged rows"


def _in_order(digests: dict[str, str]) -> Iterator[tuple[Position, str]]:
    """A format-1 manifest's digests (by `row_name`), in the order of the rows' walk."""
    places = []
    for name, digest in digests.items():
        key, node, hlc = name.split("/")
        unsigned = int(node, 16)
        places.append(((bytes.fromhex(key), unsigned - (unsigned >> 63 << 64), int(hlc)), digest))
    return iter(sorted(places))


@dataclass
class Tally:
    """The first `MAX_NAMED` damaged rows by name, and how many more."""

    named: list[str] = field(default_factory=list)
    more: int = 0

    def add(self, problem: str) -> None:
        if len(self.named) < MAX_NAMED:
            self.named.append(problem)
        else:
            self.more += 1


def _walk(
    table: str,
    rows: Iterator[tuple[object, object, object, object]],
    expected: Iterator[tuple[Position, str]],
    damaged: Tally,
) -> None:
    """Merge the table's rows with their digests, both in (key, node, hlc) order."""
    want = next(expected, None)
    for key, node, hlc, envelope in rows:
        if not _fits(key, node, hlc, envelope):
            shown = bytes(key).hex() if isinstance(key, bytes) else repr(key)
            damaged.add(f"{table} row {shown} {node!r}:{hlc!r} is damaged")
            continue
        assert isinstance(key, bytes) and isinstance(envelope, bytes)
        place: Position = (key, int(node), int(hlc))  # type: ignore[call-overload]
        while want is not None and want[0] < place:
            damaged.add(f"{table} row {row_name(*want[0])} is missing")
            want = next(expected, None)
        name = row_name(*place)
        if want is None or want[0] != place:
            damaged.add(f"{table} row {name} was not in the backup when it was taken")
            continue
        if want[1] != hashlib.sha256(envelope).hexdigest():
            damaged.add(f"{table} row {name}: its envelope changed since the backup")
        want = next(expected, None)
    while want is not None:
        damaged.add(f"{table} row {row_name(*want[0])} is missing")
        want = next(expected, None)


def _held_problems(db: sqlite3.Connection) -> Iterator[str]:
    """Held rows are counted, not digested (they wait to be merged): their types are checked."""
    (damaged,) = db.execute(
        "SELECT count(*) FROM held WHERE typeof(key) != 'blob' OR typeof(envelope) != 'blob'"
        " OR typeof(node) != 'integer' OR typeof(hlc) != 'integer'"
    ).fetchone()
    if damaged:
        yield f"held holds {damaged} row(s) of the wrong types"


def _fits(key: object, node: object, hlc: object, envelope: object) -> bool:
    """The row's columns have their types, and its envelope's header parses and names them."""
    if not (isinstance(key, bytes) and isinstance(envelope, bytes)):
        return False
    if type(node) is not int or type(hlc) is not int:
        return False
    try:
        header = parse_header(envelope)
    except ProtocolError:
        return False
    return (header.key, header.node, header.hlc) == (key, node_from_i64(node), hlc)
