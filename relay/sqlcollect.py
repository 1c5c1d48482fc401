"""The statements of tombstone collection, shared by every SQL backend (`relay.sql`): a run,
the markers a page carries, and the ghosts a push meets (`relay.collection`)."""

from __future__ import annotations

from relay.collection import Candidate, ack_floor
from relay.dialect import Transaction
from relay.errors import NotFoundError
from relay.storage import CollectReport
from replica.wire import CollectedRun, VersionVector, decode_vector, node_from_i64, pack_markers

CANDIDATES = (
    "SELECT v.seq, v.key, v.node, v.hlc, v.vector, length(v.envelope) FROM versions v"
    " WHERE v.account = ? AND v.tomb = 1 AND v.seq <= ? AND NOT EXISTS"
    " (SELECT 1 FROM versions o WHERE o.account = v.account AND o.key = v.key"
    " AND o.seq <> v.seq) ORDER BY v.seq LIMIT ?"
)
"""Declared tombstones at or below the floor that are their key's sole stored version."""


def collect(tx: Transaction, name: str, now_ms: int, limit: int) -> CollectReport:
    """One run over `name`'s versions (`Storage.collect`), under the account's row lock."""
    row = tx.one("SELECT id, head FROM accounts WHERE name = ? FOR NO KEY UPDATE", (name,))
    if row is None:
        raise NotFoundError("no such account")
    account_id, head = row
    acks = tx.all("SELECT ack_seq FROM devices WHERE account = ?", (account_id,))
    floor = ack_floor(ack for (ack,) in acks)
    if floor is None:
        return CollectReport(name, None, None, 0, 0, 0)
    released = tx.run(
        "DELETE FROM collect_runs WHERE account = ? AND seq <= ?", (account_id, floor)
    )
    tx.run("DELETE FROM collected WHERE account = ? AND seq <= ?", (account_id, floor))
    taken = [Candidate(*c) for c in tx.all(CANDIDATES, (account_id, floor, limit))]
    if not taken:
        return CollectReport(name, floor, None, 0, 0, released)
    run = head + 1
    size = delete_as_run(tx, account_id, run, taken, (now_ms, floor))
    tx.announce(name, run)
    return CollectReport(name, floor, run, len(taken), size, released)


def delete_as_run(
    tx: Transaction, account_id: int, run: int, taken: list[Candidate], at: tuple[int, int]
) -> int:
    """Delete `taken` as run `run` (at (time, floor)), keeping their dots; their bytes."""
    size = sum(c.size for c in taken)
    tx.run_in(
        "DELETE FROM versions WHERE account = ? AND seq = ANY(?)",
        (account_id,),
        [c.seq for c in taken],
    )
    tx.run_many(
        "INSERT INTO collected (account, key, node, hlc, vector, seq) VALUES (?, ?, ?, ?, ?, ?)",
        [(account_id, c.key, c.node, c.hlc, c.vector, run) for c in taken],
    )
    tx.run(
        "INSERT INTO collect_runs (account, seq, at_ms, ack_floor, versions, bytes)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (account_id, run, *at, len(taken), size),
    )
    tx.run(
        "UPDATE accounts SET head = ?, stored_bytes = stored_bytes - ?,"
        " collected_versions = collected_versions + ?, collected_bytes = collected_bytes + ?"
        " WHERE id = ?",
        (run, size, len(taken), size, account_id),
    )
    return size


def next_run(tx: Transaction, account_id: int, cursor: int) -> int | None:
    """The seq of the account's first retained run after `cursor`."""
    row = tx.one(
        "SELECT seq FROM collect_runs WHERE account = ? AND seq > ? ORDER BY seq LIMIT 1",
        (account_id, cursor),
    )
    return None if row is None else int(row[0])


def run_markers(tx: Transaction, account_id: int, run: int) -> CollectedRun:
    rows = tx.all(
        "SELECT key, node, hlc FROM collected WHERE account = ? AND seq = ?"
        " ORDER BY key, node, hlc",
        (account_id, run),
    )
    return CollectedRun(run, pack_markers((key, node_from_i64(n), h) for key, n, h in rows))


def ghosts_of(
    tx: Transaction, account_id: int, keys: list[bytes]
) -> dict[bytes, list[VersionVector]]:
    """The vectors of the collected tombstones of `keys` that retained runs keep; one probe,
    and nothing more, for an account with no run retained."""
    if tx.one("SELECT 1 FROM collect_runs WHERE account = ? LIMIT 1", (account_id,)) is None:
        return {}
    ghosts: dict[bytes, list[VersionVector]] = {}
    rows = tx.all_in(
        "SELECT key, vector FROM collected WHERE account = ? AND key = ANY(?)", (account_id,), keys
    )
    for key, vector in rows:
        ghosts.setdefault(bytes(key), []).append(decode_vector(bytes(vector)))
    return ghosts
