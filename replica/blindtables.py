"""The replica file's statements on its blind index (replica/blind.py): each version's
`blind` entry and `created` place, which the chat store pages, counts and lists by.

A mixin of `Store`, which owns the connection and its transactions; only SQL lives here.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator

from replica.asides import Row
from replica.wire import node_from_i64


class BlindTables:
    """The statements on the versions' blind index columns."""

    db: sqlite3.Connection

    def blind_keys(
        self, blind: bytes, after: tuple[int, bytes] | None, newest_first: bool, limit: int
    ) -> list[tuple[int, bytes]]:
        """(created, key) of versions under a blind index entry, in creation order (then
        key order), after the position `after` (replica/blind.py)."""
        order, beyond = ("DESC", "<") if newest_first else ("ASC", ">")
        where = "" if after is None else f" AND (created, key) {beyond} (?, ?)"
        rows = self.db.execute(
            f"SELECT created, key FROM versions WHERE blind = ?{where}"
            f" ORDER BY created {order}, key {order} LIMIT ?",
            (blind, *(after or ()), limit),
        ).fetchall()
        return [(created, bytes(key)) for created, key in rows]

    def blind_listed_before(
        self, blind: bytes, key: bytes, position: tuple[int, bytes], newest_first: bool
    ) -> bool:
        """Whether record `key` has an entry under `blind` at or before `position` in the
        read order: a page that starts after `position` listed it already."""
        upto = ">=" if newest_first else "<="
        row = self.db.execute(
            f"SELECT 1 FROM versions WHERE blind = ? AND key = ? AND (created, key) {upto} (?, ?)",
            (blind, key, *position),
        ).fetchone()
        return row is not None

    def blind_last(self, blind: bytes) -> int | None:
        """The greatest `created` under a blind index entry (one step down the index)."""
        row = self.db.execute("SELECT max(created) FROM versions WHERE blind = ?", (blind,))
        last = row.fetchone()[0]
        return None if last is None else int(last)

    def blind_degraded(self, blind: bytes) -> int:
        """How many degraded records have a version under a blind index entry (the degraded
        table is small: it is read whole)."""
        row = self.db.execute(
            "SELECT count(*) FROM degraded d WHERE EXISTS"
            " (SELECT 1 FROM versions v WHERE v.key = d.key AND v.blind = ?)",
            (blind,),
        ).fetchone()
        return int(row[0])

    def blind_stats(
        self, blind: bytes, with_bytes: bool
    ) -> tuple[int, int | None, int | None, int]:
        """(records, first created, last created, envelope bytes or 0) under a blind index
        entry: from the index alone, but for the bytes (which read every row)."""
        records, first, last = self.db.execute(
            "SELECT count(DISTINCT key), min(created), max(created) FROM versions WHERE blind = ?",
            (blind,),
        ).fetchone()
        size = 0
        if with_bytes:
            size = self.db.execute(
                "SELECT coalesce(sum(length(envelope)), 0) FROM versions WHERE key IN"
                " (SELECT key FROM versions WHERE blind = ?)",
                (blind,),
            ).fetchone()[0]
        return int(records), first, last, int(size)

    def rows_for_index(
        self, scopes: Iterable[bytes] | None
    ) -> Iterator[tuple[int, Row, bytes, tuple[bytes, int] | None]]:
        """(row id, version, scope, index entry) of every stored version, or of `scopes`."""
        where, args = "", tuple[bytes, ...]()
        if scopes is not None:
            args = tuple(scopes)
            where = f" WHERE scope IN ({','.join('?' * len(args))})"
        for rowid, key, node, hlc, scope, envelope, blind, created in self.db.execute(
            f"SELECT id, key, node, hlc, scope, envelope, blind, created FROM versions{where}",
            args,
        ):
            entry = None if blind is None else (bytes(blind), created)
            yield rowid, Row(key, node_from_i64(node), hlc, envelope), scope, entry

    def set_blind(self, updates: Iterable[tuple[bytes | None, int | None, int]]) -> None:
        """Set (blind, created) of versions by row id."""
        self.db.executemany("UPDATE versions SET blind = ?, created = ? WHERE id = ?", updates)
