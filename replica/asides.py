"""The replica file's tables that keep things aside from its versions (specs/replica.md §2):
held versions, freshness locks, device-local records, degraded marks and quarantine.

A mixin of `Store`, which owns the connection and its transactions; only SQL lives here.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import msgspec

from replica.locks import Lock
from replica.wire import node_from_i64, node_to_i64


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def envelope_sha256_16(envelope: bytes) -> bytes:
    """The first 16 bytes of an envelope's SHA-256: held versions are not opened yet, so two
    copies of one identity with different bytes are both kept until one opens."""
    return hashlib.sha256(envelope).digest()[:16]


class Row(msgspec.Struct, frozen=True, gc=False):
    """One stored version: where it lives in the file and its sealed bytes."""

    key: bytes
    node: int
    hlc: int
    envelope: bytes


@dataclass(frozen=True, slots=True)
class HeldRow:
    key: bytes
    node: int
    hlc: int
    envelope: bytes
    reason: str
    release_after_ms: int | None
    repush: bool


@dataclass(frozen=True, slots=True)
class HeldVersion:
    """A version to hold: why, until when (if known), in which scope (if known), and whether
    a reseed still wants it pushed."""

    row: Row
    reason: str
    release_after_ms: int | None
    scope: bytes | None
    repush: bool = False


class AsideTables:
    """The statements on held, locks, local, degraded and quarantine rows."""

    db: sqlite3.Connection
    transactions: int
    _next_lock_sweep_ms: int
    rollbacks = 0
    """Rollbacks of a transaction or a savepoint on this connection: one undoes rows that
    `total_changes` counted, and another connection's `data_version` never sees it."""
    _data_version: tuple[int, int] | None = None
    """(`transactions`, PRAGMA data_version) as read in the open write transaction: no other
    connection commits while it holds the write lock, so it is read once per transaction."""

    # -- held ---------------------------------------------------------------------------------

    def hold(self, rows: Iterable[HeldVersion]) -> None:
        """Persist held versions; never dropped. A reseed's push mark survives re-holding.

        Held copies are told apart by their bytes too: an unverified forgery held under a
        genuine version's identity must not push the genuine bytes out."""
        self.db.executemany(
            "INSERT INTO held (key, node, hlc, digest, envelope, reason, release_after_ms, scope, "
            "repush) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (key, node, hlc, digest) DO UPDATE SET "
            "reason = excluded.reason, release_after_ms = excluded.release_after_ms, "
            "scope = coalesce(excluded.scope, held.scope), "
            "repush = max(held.repush, excluded.repush)",
            [
                (
                    h.row.key,
                    node_to_i64(h.row.node),
                    h.row.hlc,
                    envelope_sha256_16(h.row.envelope),
                    h.row.envelope,
                    h.reason,
                    h.release_after_ms,
                    h.scope,
                    int(h.repush),
                )
                for h in rows
            ],
        )

    def held_rows(self, reasons: Sequence[str] | None = None) -> list[HeldRow]:
        query = "SELECT key, node, hlc, envelope, reason, release_after_ms, repush FROM held"
        args: tuple[str, ...] = ()
        if reasons is not None:
            query += f" WHERE reason IN ({','.join('?' * len(reasons))})"
            args = tuple(reasons)
        return [
            HeldRow(k, node_from_i64(n), h, e, why, after, bool(repush))
            for k, n, h, e, why, after, repush in self.db.execute(query + " ORDER BY hlc", args)
        ]

    def held_of(self, keys: Sequence[bytes], reasons: Sequence[str]) -> list[tuple[bytes, bytes]]:
        """(key, envelope) of the versions of `keys` held for one of `reasons`."""
        found: list[tuple[bytes, bytes]] = []
        unique, marks = list(dict.fromkeys(keys)), ",".join("?" * len(reasons))
        for start in range(0, len(unique), 500):
            chunk = unique[start : start + 500]
            found += self.db.execute(
                f"SELECT key, envelope FROM held WHERE key IN ({','.join('?' * len(chunk))})"
                f" AND reason IN ({marks})",
                (*chunk, *reasons),
            ).fetchall()
        return found

    def unhold(self, rows: Iterable[HeldRow]) -> None:
        self.db.executemany(
            "DELETE FROM held WHERE key = ? AND node = ? AND hlc = ? AND digest = ?",
            [(r.key, node_to_i64(r.node), r.hlc, envelope_sha256_16(r.envelope)) for r in rows],
        )

    def unverified_held_bytes(self) -> int:
        """Bytes held that could not be authenticated yet (pulled while locked, unknown epoch)."""
        row = self.db.execute(
            "SELECT coalesce(sum(length(envelope)), 0) FROM held "
            "WHERE reason IN ('sealed', 'epoch')"
        ).fetchone()
        return int(row[0])

    def next_release_ms(self) -> int | None:
        row = self.db.execute("SELECT min(release_after_ms) FROM held").fetchone()
        return None if row[0] is None else int(row[0])

    def count_held(self) -> dict[str, int]:
        return dict(self.db.execute("SELECT reason, count(*) FROM held GROUP BY reason").fetchall())

    # -- locks --------------------------------------------------------------------------------

    def add_lock(
        self, kind: str, target: bytes, expires_ms: int, dot: tuple[int, int] | None = None
    ) -> int:
        node, hlc = (None, None) if dot is None else (node_to_i64(dot[0]), dot[1])
        cursor = self.db.execute(
            "INSERT INTO locks (kind, target, expires_ms, dot_node, dot_hlc) VALUES (?, ?, ?, ?, ?)",
            (kind, target, expires_ms, node, hlc),
        )
        return int(cursor.lastrowid or 0)

    def replace_auto_lock(
        self, key: bytes, now_ms: int, expires_ms: int, dot: tuple[int, int]
    ) -> None:
        """The automatic lock of a record follows its latest local write; expired locks are
        swept at most once a second (they are ignored by `active_locks` meanwhile)."""
        self.db.execute("DELETE FROM locks WHERE kind = 'auto' AND target = ?", (key,))
        if now_ms >= self._next_lock_sweep_ms:
            self.db.execute("DELETE FROM locks WHERE expires_ms <= ?", (now_ms,))
            self._next_lock_sweep_ms = now_ms + 1000
        self.add_lock("auto", key, expires_ms, dot)

    def active_locks(self, now_ms: int, keys: Sequence[bytes]) -> list[Lock]:
        """The unexpired locks that may hold back a version of records `keys`: those records'
        own (`auto`, `record`), and every lock of a scope or profile (an app takes those by
        hand: a few). Not every record's: a device that just wrote a million records holds a
        million automatic locks, and a page of a thousand versions needs at most its own."""
        columns = "SELECT id, kind, target, expires_ms, dot_node, dot_hlc FROM locks"
        rows = self.db.execute(
            f"{columns} WHERE expires_ms > ? AND kind NOT IN ('auto', 'record')", (now_ms,)
        ).fetchall()
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), 500):
            chunk = unique[start : start + 500]
            rows += self.db.execute(
                f"{columns} WHERE target IN ({','.join('?' * len(chunk))})"
                " AND kind IN ('auto', 'record') AND expires_ms > ?",
                (*chunk, now_ms),
            ).fetchall()
        return [
            Lock(i, kind, target, exp, None if n is None else (node_from_i64(n), h))
            for i, kind, target, exp, n, h in rows
        ]

    def delete_lock(self, lock_id: int) -> bool:
        return self.db.execute("DELETE FROM locks WHERE id = ?", (lock_id,)).rowcount > 0

    # -- local (device-only) records ----------------------------------------------------------

    def get_local(self, key: bytes) -> bytes | None:
        row = self.db.execute("SELECT envelope FROM local WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def put_local(self, key: bytes, scope: bytes, envelope: bytes, changed: int) -> None:
        self.db.execute(
            "INSERT INTO local (key, scope, envelope, changed) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET envelope = excluded.envelope, "
            "changed = excluded.changed",
            (key, scope, envelope, changed),
        )

    def local_in_scope(self, scope: bytes) -> list[tuple[bytes, bytes]]:
        return self.db.execute(
            "SELECT key, envelope FROM local WHERE scope = ? ORDER BY key", (scope,)
        ).fetchall()

    # -- journals (device-only logs) -----------------------------------------------------------

    def journal_head(self, log: bytes) -> tuple[int, int] | None:
        """(seq, floor) of the journal's newest row; None if it has none."""
        row = self.db.execute(
            "SELECT seq, floor FROM journal WHERE log = ? ORDER BY seq DESC LIMIT 1", (log,)
        ).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    def journal_newest(self, log: bytes) -> tuple[int, int, bytes] | None:
        """(seq, floor, envelope) of the journal's newest row; None if it has none."""
        row = self.db.execute(
            "SELECT seq, floor, envelope FROM journal WHERE log = ? ORDER BY seq DESC LIMIT 1",
            (log,),
        ).fetchone()
        return None if row is None else (int(row[0]), int(row[1]), bytes(row[2]))

    def journal_push(
        self, log: bytes, seq: int, floor: int, key: bytes, scope: bytes, envelope: bytes
    ) -> None:
        self.db.execute(
            "INSERT INTO journal (log, seq, floor, key, scope, envelope) VALUES (?, ?, ?, ?, ?, ?)",
            (log, seq, floor, key, scope, envelope),
        )

    def journal_sweep(self, log: bytes, floor: int) -> None:
        """Delete the rows that fell below the journal's floor (never given back)."""
        self.db.execute("DELETE FROM journal WHERE log = ? AND seq < ?", (log, floor))

    def journal_remove(self, log: bytes, seq: int) -> None:
        """Delete one row, handing its floor to the row below (the newest, once it goes)."""
        self.db.execute(
            "UPDATE journal SET floor = max(floor, "
            "(SELECT floor FROM journal WHERE log = ?1 AND seq = ?2)) "
            "WHERE log = ?1 AND seq = (SELECT max(seq) FROM journal WHERE log = ?1 AND seq < ?2)",
            (log, seq),
        )
        self.db.execute("DELETE FROM journal WHERE log = ? AND seq = ?", (log, seq))

    def awaiting(self, log: bytes, newest: int) -> list[tuple[Row, bytes]]:
        """The `newest` versions whose entry in journal `log` is deferred, oldest first, with
        their scopes (the partial index holds only such rows)."""
        rows = self.db.execute(
            "SELECT key, node, hlc, envelope, scope FROM versions WHERE awaits = ?"
            " ORDER BY hlc DESC LIMIT ?",
            (log, newest),
        ).fetchall()
        return [
            (Row(bytes(key), node_from_i64(node), hlc, bytes(envelope)), bytes(scope))
            for key, node, hlc, envelope, scope in reversed(rows)
        ]

    def clear_awaiting(self, log: bytes) -> None:
        self.db.execute("UPDATE versions SET awaits = NULL WHERE awaits = ?", (log,))

    def journal_count(self, log: bytes) -> int:
        """The rows at or above the newest row's floor."""
        row = self.db.execute(
            "SELECT count(*) FROM journal WHERE log = ?1 AND seq >= "
            "(SELECT floor FROM journal WHERE log = ?1 ORDER BY seq DESC LIMIT 1)",
            (log,),
        ).fetchone()
        return int(row[0])

    # -- degraded and quarantine --------------------------------------------------------------

    def mark_degraded(self, key: bytes, scope: bytes | None, reason: str) -> None:
        self.db.execute(
            "INSERT INTO degraded (key, scope, reason) VALUES (?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET scope = coalesce(excluded.scope, degraded.scope)",
            (key, scope, reason),
        )

    def is_degraded(self, key: bytes) -> bool:
        return (
            self.db.execute("SELECT 1 FROM degraded WHERE key = ?", (key,)).fetchone() is not None
        )

    def count_degraded(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM degraded").fetchone()[0])

    def clear_degraded(self) -> None:
        self.db.execute("DELETE FROM degraded")

    def quarantine(
        self,
        source: str,
        key: bytes | None,
        envelope: bytes,
        reason: str,
        at_ms: int,
        dot: tuple[int, int] | None = None,
    ) -> None:
        """Keep unreadable bytes verbatim; `dot` names a row this replica itself held."""
        node, hlc = (None, None) if dot is None else (node_to_i64(dot[0]), dot[1])
        self.db.execute(  # the same bytes once: a re-pull after a repair adds no second row
            "INSERT INTO quarantine (source, key, node, hlc, envelope, reason, at_ms, digest) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (digest) DO NOTHING",
            (source, key, node, hlc, envelope, reason, at_ms, sha256(envelope)),
        )

    # -- leases -------------------------------------------------------------------------------

    def take_lease(self, name: bytes, owner: bytes, now_ms: int, expires_ms: int) -> int | None:
        """Take lease `name` for `owner` unless another holds it and it has not run out;
        then return when the holder's runs out. Leases that ran out are swept first."""
        self.db.execute("DELETE FROM leases WHERE expires_ms <= ?", (now_ms,))
        row = self.db.execute("SELECT owner, expires_ms FROM leases WHERE name = ?", (name,))
        holder = row.fetchone()
        if holder is not None and bytes(holder[0]) != owner:
            return int(holder[1])
        self.db.execute(
            "INSERT INTO leases (name, owner, expires_ms) VALUES (?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, "
            "expires_ms = excluded.expires_ms",
            (name, owner, expires_ms),
        )
        return None

    def renew_lease(self, name: bytes, owner: bytes, now_ms: int, expires_ms: int) -> bool:
        """Extend `owner`'s lease; False when it no longer holds it, or it ran out (another
        may have worked under it since: renewing would hide that from `check`)."""
        cursor = self.db.execute(
            "UPDATE leases SET expires_ms = ? WHERE name = ? AND owner = ? AND expires_ms > ?",
            (expires_ms, name, owner, now_ms),
        )
        return cursor.rowcount > 0

    def holds_lease(self, name: bytes, owner: bytes, now_ms: int) -> bool:
        row = self.db.execute(
            "SELECT 1 FROM leases WHERE name = ? AND owner = ? AND expires_ms > ?",
            (name, owner, now_ms),
        ).fetchone()
        return row is not None

    def drop_lease(self, name: bytes, owner: bytes) -> None:
        self.db.execute("DELETE FROM leases WHERE name = ? AND owner = ?", (name, owner))

    def lease_held(self, name: bytes, now_ms: int) -> bool:
        row = self.db.execute(
            "SELECT 1 FROM leases WHERE name = ? AND expires_ms > ?", (name, now_ms)
        ).fetchone()
        return row is not None

    def version_envelope_bytes(self) -> int:
        """The bytes of every current and held envelope, summed by SQLite (none is read)."""
        (total,) = self.db.execute(
            "SELECT (SELECT coalesce(sum(length(envelope)), 0) FROM versions)"
            " + (SELECT coalesce(sum(length(envelope)), 0) FROM held)"
        ).fetchone()
        return int(total)

    def change_mark(self) -> ChangeMark:
        """What names the file's contents as this connection sees them now (`ChangeMark`),
        inside a write transaction."""
        if self._data_version is None or self._data_version[0] != self.transactions:
            (data_version,) = self.db.execute("PRAGMA data_version").fetchone()
            self._data_version = (self.transactions, int(data_version))
        return ChangeMark(self.db, self._data_version[1], self.db.total_changes, self.rollbacks)


@dataclass(frozen=True)
class ChangeMark:
    """The same exactly while nothing changes the file: no row changed on this connection
    (`total_changes`, any thread's) and none rolled back, no commit of another connection
    (`data_version`, any process's), and no new connection (a reopen after a disk error)."""

    connection: sqlite3.Connection
    data_version: int
    changes: int
    rollbacks: int

    def __repr__(self) -> str:
        counts = f"changes={self.changes}, rollbacks={self.rollbacks}"
        return f"ChangeMark(data_version={self.data_version}, {counts})"
