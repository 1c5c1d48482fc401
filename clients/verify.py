"""Checking backups without the passphrase (`sealsync backup verify`).

A backup is good when its manifest reads back whole, names its file, and the file has the
size and SHA-256 the manifest says, passes SQLite's `integrity_check`, is a replica of the
format the manifest says, holds the rows it says, and every envelope's header parses and
belongs to its row. Anything else is damage, named; a file that cannot be read at all (no
permission) is unreadable. In a folder, a backup file without its manifest, a manifest
without its file, and any other file are damage too: a set that was cut short or changed.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from clients.manifest import COUNTED_TABLES, file_digest, manifest_path, read_manifest
from replica.errors import ProtocolError, StoreError
from replica.migrations import APPLICATION_ID
from replica.snapshot import read_only_uri
from replica.wire import node_from_i64, parse_header

State = Literal["ok", "damaged", "unreadable"]
MAX_NAMED = 20
"""Damaged rows named one by one; past that, counted."""


@dataclass(frozen=True)
class Verdict:
    backup: Path
    state: State
    problems: tuple[str, ...]


def verify_folder(folder: Path) -> list[Verdict]:
    """A verdict for each backup in `folder`, and one for each file that is no part of one."""
    if not folder.is_dir():
        raise StoreError(f"no folder {folder}", hint="give the folder given to `backup --to`")
    verdicts = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or path.is_dir():
            continue  # a copy in progress (temporary names begin with a dot), or a folder
        if path.suffix == ".db":
            verdicts.append(verify_backup(path))
        elif path.suffix == ".json" and not path.with_suffix(".db").exists():
            verdicts.append(
                Verdict(path, "damaged", ("the backup file of this manifest is missing",))
            )
        elif path.suffix != ".json":
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
    yield from _database_problems(backup, manifest.replica_format, manifest.rows)


def _database_problems(backup: Path, replica_format: int, rows: dict[str, int]) -> Iterator[str]:
    try:
        with closing(sqlite3.connect(read_only_uri(backup) + "&immutable=1", uri=True)) as db:
            check = [r[0] for r in db.execute("PRAGMA integrity_check(20)")]
            if check != ["ok"]:
                yield f"integrity_check: {'; '.join(check)}"
                return
            if db.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
                yield "not a sealsync replica"
                return
            if (found := db.execute("PRAGMA user_version").fetchone()[0]) != replica_format:
                yield f"replica format {found}, the manifest says {replica_format}"
            for table in COUNTED_TABLES:
                count = db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                if count != rows.get(table):
                    yield f"{table} holds {count} rows, the manifest says {rows.get(table)}"
            yield from _header_problems(db)
    except sqlite3.DatabaseError as exc:
        yield f"not a readable SQLite file: {exc}"


def _header_problems(db: sqlite3.Connection) -> Iterator[str]:
    """Every envelope's header parses and names its row (key, node, hlc)."""
    named = damaged = 0
    for table in ("versions", "history"):
        for key, node, hlc, envelope in db.execute(f"SELECT key, node, hlc, envelope FROM {table}"):
            if not _fits(key, node, hlc, envelope):
                damaged += 1
                if named < MAX_NAMED:
                    named += 1
                    shown = bytes(key).hex() if isinstance(key, bytes) else repr(key)
                    yield f"{table} row {shown} {node!r}:{hlc!r} is damaged"
    if damaged > named:
        yield f"and {damaged - named} more damaged rows"


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
