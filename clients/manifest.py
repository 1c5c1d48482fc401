"""The manifest beside each backup: what the backup file holds, so that it can be checked
without the passphrase (`clients/verify.py`).

A backup is `NAME.db` with `NAME.json` beside it. The manifest names its file, the file's
size and SHA-256, the replica format, the node it was taken from, when, how many rows each
table of shared data holds, and the SHA-256 of every envelope in `versions` and `history`
(so that a damaged file names the records it damaged); its own SHA-256 (over the other
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
from replica.errors import StoreError
from replica.files import read_only_uri

MANIFEST_FORMAT = 1
COUNTED_TABLES = ("versions", "history", "held", "quarantine")
"""The tables of shared data a backup keeps (device-local ones are left out of it)."""
DIGESTED_TABLES = ("versions", "history")
"""The tables whose envelopes are the records' data; each envelope's SHA-256 is kept."""
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
    envelopes: dict[str, dict[str, str]]
    """Per table of `DIGESTED_TABLES`: each row's `row_name` and its envelope's SHA-256."""
    bundle_sha256: str
    """Of the key bundle the backup holds: a backup with the same rows but another bundle
    (the passphrase changed, or the keys rotated) is another backup."""
    scope: str
    """What it holds: `all`, or `profile-TAG`, one profile's records (TAG: 8 hex digits of
    a local HMAC of its name, which the file never holds in clear)."""

    def same_content(self, other: Manifest) -> bool:
        """Whether both backups hold the same rows and key bundle (whenever, whatever node)."""
        return all(getattr(self, name) == getattr(other, name) for name in _CONTENT)


_CONTENT = ("replica_format", "rows", "envelopes", "bundle_sha256", "scope")
"""The fields that say what a backup holds (not where, when, or from which node)."""


def row_name(key: bytes, node: int, hlc: int) -> str:
    """How a manifest and `verify` name a row: its key, node (as stored) and hlc."""
    return f"{key.hex()}/{node & 0xFFFF_FFFF_FFFF_FFFF:016x}/{hlc}"


def envelope_digests(db: sqlite3.Connection, table: str) -> dict[str, str]:
    """`row_name` → SHA-256 of its envelope, for a table of well-typed rows."""
    rows = db.execute(f"SELECT key, node, hlc, envelope FROM {table}")
    return {row_name(k, n, h): hashlib.sha256(e).hexdigest() for k, n, h, e in rows}


def manifest_path(backup: Path) -> Path:
    return backup.with_suffix(".json")


def describe(
    backup: Path, name: str, node: int, taken_at: datetime.datetime, scope: str = "all"
) -> Manifest:
    """The manifest of the backup file at `backup` (to be named `name`), as it is now."""
    size, digest = file_digest(backup)
    with closing(sqlite3.connect(read_only_uri(backup), uri=True)) as db:
        replica_format = int(db.execute("PRAGMA user_version").fetchone()[0])
        rows = {
            t: int(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in COUNTED_TABLES
        }
        envelopes = {t: envelope_digests(db, t) for t in DIGESTED_TABLES}
        bundle = db.execute("SELECT value FROM meta WHERE name = 'bundle'").fetchone() or (b"",)
    stamp = taken_at.astimezone(datetime.UTC).isoformat(timespec="microseconds")
    bundle_sha256 = hashlib.sha256(bundle[0]).hexdigest()
    node_hex = f"{node:016x}"
    return Manifest(
        name, size, digest, replica_format, node_hex, stamp, rows, envelopes, bundle_sha256, scope
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
    fields = asdict(manifest)
    document = {"sealsync_backup": MANIFEST_FORMAT, **fields, "self_sha256": _seal(fields)}
    write_atomically(path, json.dumps(document, indent=2, sort_keys=True).encode() + b"\n")


def read_manifest(path: Path) -> Manifest:
    """The manifest at `path`; `StoreError` naming what is wrong with it (a damaged one is
    never taken for what it says)."""
    try:
        document = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreError(f"{path} is not a manifest: {exc}") from None
    if not isinstance(document, dict) or document.get("sealsync_backup") != MANIFEST_FORMAT:
        raise StoreError(f"{path} is not a sealsync backup manifest of format {MANIFEST_FORMAT}")
    fields = {k: v for k, v in document.items() if k not in ("sealsync_backup", "self_sha256")}
    if document.get("self_sha256") != _seal(fields):
        raise StoreError(f"{path} was changed after it was written (its own SHA-256 differs)")
    try:  # every field, of its type (strict: no string taken for a number)
        manifest = msgspec.convert(fields, Manifest, strict=True)
    except msgspec.ValidationError as exc:
        raise StoreError(f"{path} is not a manifest of this format: {exc}") from None
    if set(manifest.envelopes) != set(DIGESTED_TABLES):
        raise StoreError(
            f"{path} has envelope digests of {sorted(manifest.envelopes)}, "
            f"not of {list(DIGESTED_TABLES)}"
        )
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
