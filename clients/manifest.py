"""The manifest beside each backup: what the backup file holds, so that it can be checked
without the passphrase (`clients/verify.py`).

A backup is `NAME.db` with `NAME.json` beside it. The manifest names its file, the file's
size and SHA-256, the replica format, the node it was taken from, when, how many rows each
table of shared data holds, and the SHA-256 of `NAME.rows`, which holds the SHA-256 of every
envelope in `versions` and `history` (so that a damaged file names the records it damaged,
clients/rowdigests.py); its own SHA-256 (over the other
fields) catches a manifest changed by accident (anyone can compute it again: it is no
defence against a forger). It is written before the backup file takes its name, so a crash
leaves a manifest without its backup, never a backup that looks cut short.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import sqlite3
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec

from clients.device import write_atomically
from clients.rowdigests import write_row_digests
from replica.errors import StoreError
from replica.files import read_only_uri

MANIFEST_FORMAT = 2
"""Written: 2, the envelopes' digests in `NAME.rows`. Read: 2, and 1, which held them all in
the manifest, read whole (hundreds of MiB for a million records)."""
COUNTED_TABLES = ("versions", "history", "held", "quarantine")
"""The tables of shared data a backup keeps (device-local ones are left out of it)."""
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Manifest:
    file: str
    bytes: int
    sha256: str
    replica_format: int
    node: str
    """The source replica's node id (16 hex digits): a restore takes a new one."""
    taken_at: str
    """ISO 8601, UTC."""
    rows: dict[str, int]
    bundle_sha256: str
    """Of the key bundle the backup holds: a backup with the same rows but another bundle
    (the passphrase changed, or the keys rotated) is another backup."""
    scope: str
    """What it holds: `all`, or `profile-TAG`, one profile's records (TAG: 8 hex digits of
    a local HMAC of its name, which the file never holds in clear)."""
    rows_sha256: str = ""
    """Of the row digests file (`rows_path`): the SHA-256 of each envelope, by row."""
    envelopes: dict[str, dict[str, str]] | None = None
    """Format 1 only, in place of the row digests file: per table, each row's `row_name`
    and its envelope's SHA-256 (read whole; still checked, no longer written)."""

    def same_content(self, other: Manifest) -> bool:
        """Whether both backups hold the same rows and key bundle (whenever, whatever node)."""
        return all(getattr(self, name) == getattr(other, name) for name in _CONTENT)


_CONTENT = ("replica_format", "rows", "rows_sha256", "bundle_sha256", "scope")
"""The fields that say what a backup holds (not where, when, or from which node)."""


def row_name(key: bytes, node: int, hlc: int) -> str:
    """How a manifest and `verify` name a row: its key, node (as stored) and hlc."""
    return f"{key.hex()}/{node & 0xFFFF_FFFF_FFFF_FFFF:016x}/{hlc}"


def manifest_path(backup: Path) -> Path:
    return backup.with_suffix(".json")


def describe(
    backup: Path,
    name: str,
    node: int,
    taken_at: datetime.datetime,
    scope: str = "all",
    *,
    digests_to: Path,
) -> Manifest:
    """The manifest of the backup file at `backup` (to be named `name`), as it is now; the
    digests of its rows are written to `digests_to` (its `rows_path`)."""
    size, digest = file_digest(backup)
    with closing(sqlite3.connect(read_only_uri(backup), uri=True)) as db:
        replica_format = int(db.execute("PRAGMA user_version").fetchone()[0])
        rows = {
            t: int(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in COUNTED_TABLES
        }
        rows_sha256 = write_row_digests(db, digests_to)
        bundle = db.execute("SELECT value FROM meta WHERE name = 'bundle'").fetchone() or (b"",)
    stamp = taken_at.astimezone(datetime.UTC).isoformat(timespec="microseconds")
    bundle_sha256 = hashlib.sha256(bundle[0]).hexdigest()
    node_hex = f"{node:016x}"
    return Manifest(
        name, size, digest, replica_format, node_hex, stamp, rows, bundle_sha256, scope, rows_sha256
    )


def file_digest(path: Path) -> tuple[int, str]:
    """(size, SHA-256 hex) of a file, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as file:
        while piece := file.read(_CHUNK):
            digest.update(piece)
            size += len(piece)
    return size, digest.hexdigest()


def write_manifest(manifest: Manifest, path: Path) -> None:
    fields = {k: v for k, v in asdict(manifest).items() if k != "envelopes"}
    document = {"sealsync_backup": MANIFEST_FORMAT, **fields, "self_sha256": _seal(fields)}
    write_atomically(path, json.dumps(document, indent=2, sort_keys=True).encode() + b"\n")


def read_manifest(path: Path) -> Manifest:
    """The manifest at `path`; `StoreError` naming what is wrong with it (a damaged one is
    never taken for what it says)."""
    try:
        document = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreError(f"{path} is not a manifest: {exc}") from None
    if not isinstance(document, dict) or document.get("sealsync_backup") not in (1, 2):
        raise StoreError(f"{path} is not a sealsync backup manifest of format 1 or 2")
    fields = {k: v for k, v in document.items() if k not in ("sealsync_backup", "self_sha256")}
    if document.get("self_sha256") != _seal(fields):
        raise StoreError(f"{path} was changed after it was written (its own SHA-256 differs)")
    digested_by, other = ("envelopes", "rows_sha256")[
        :: 1 if document["sealsync_backup"] == 1 else -1
    ]
    if digested_by not in fields or other in fields:
        raise StoreError(f"{path}: a manifest of format {document['sealsync_backup']} says "
                         f"its rows' digests in {digested_by}, and only there")  # fmt: skip
    try:  # every field, of its type (strict: no string taken for a number)
        manifest = msgspec.convert(fields, Manifest, strict=True)
    except msgspec.ValidationError as exc:
        raise StoreError(f"{path} is not a manifest of this format: {exc}") from None
    taken_at(manifest, path)
    return manifest


def _seal(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def taken_at(manifest: Manifest, path: Path) -> datetime.datetime:
    """When the backup was taken; `StoreError` unless the manifest (at `path`) says it as an
    ISO 8601 time with its UTC offset (a time without one would be read as this machine's)."""
    try:
        taken = datetime.datetime.fromisoformat(manifest.taken_at)
    except ValueError:
        taken = None
    if taken is None or taken.utcoffset() is None:
        raise StoreError(f"{path}: taken_at {manifest.taken_at!r} is not a time with its zone")
    return taken
