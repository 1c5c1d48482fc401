"""The statements of tombstone collection, shared by every SQL backend (`relay.sql`): a run,
the markers a page carries, and the ghosts a push meets (`relay.collection`)."""

from __future__ import annotations

from typing import Any

from relay.collection import Candidate, Standing, split, to_flag, waited_for
from relay.dialect import Transaction
from relay.errors import NotFoundError, ResyncRequiredError
from relay.storage import AccountSummary, CollectReport
from replica.wire import CollectedRun, VersionVector, decode_vector, node_from_i64, pack_markers

CANDIDATES = (
    "SELECT v.seq, v.key, v.node, v.hlc, v.vector, length(v.envelope) FROM versions v"
    " WHERE v.account = ? AND v.tomb = 1 AND v.seq <= ? AND NOT EXISTS"
    " (SELECT 1 FROM versions o WHERE o.account = v.account AND o.key = v.key"
    " AND o.seq <> v.seq) ORDER BY v.seq LIMIT ?"
)
"""Declared tombstones at or below the floor that are their key's sole stored version."""


def collect(
    tx: Transaction, name: str, now_ms: int, limit: int, horizon_ms: int | None
) -> CollectReport:
    """One run over `name`'s versions (`Storage.collect`), under the account's row lock."""
    row = tx.one("SELECT id, head FROM accounts WHERE name = ? FOR NO KEY UPDATE", (name,))
    if row is None:
        raise NotFoundError("no such account")
    account_id, head = row
    where = split(standings(tx, account_id), now_ms, horizon_ms)
    floor = where.floor
    if floor is None:
        return CollectReport(name, None, None, 0, 0, 0)
    released = [
        seq
        for (seq,) in tx.all(
            "DELETE FROM collect_runs WHERE account = ? AND seq <= ? RETURNING seq",
            (account_id, floor),
        )
    ]
    tx.run("DELETE FROM collected WHERE account = ? AND seq <= ?", (account_id, floor))
    taken = [Candidate(*c) for c in tx.all(CANDIDATES, (account_id, floor, limit))]
    run, size = None, 0
    if taken:
        run = head + 1
        size = delete_as_run(tx, account_id, run, taken, (now_ms, floor))
        tx.announce(name, run)
    last = run or max(released, default=None)
    flagged = to_flag(where.stale, last)
    tx.run_in(
        "UPDATE devices SET resync = 1, resync_ms = NULL WHERE account = ? AND id = ANY(?)",
        (account_id,),
        flagged,
    )
    if last is not None:  # a resync past its grace missed this run: it begins again
        tx.run(
            "UPDATE devices SET resync_ms = NULL WHERE account = ? AND resync = 1", (account_id,)
        )
        tx.give_back_free_pages()
    return CollectReport(name, floor, run, len(taken), size, len(released), len(flagged))


def standings(tx: Transaction, account_id: int) -> list[Standing]:
    """What collection knows of each device of the account (`relay.collection.split`)."""
    rows = tx.all(
        "SELECT id, ack_seq, ack_ms, created_ms, resync, resync_ms FROM devices WHERE account = ?",
        (account_id,),
    )
    return [Standing(i, a, at, c, bool(r), rm) for i, a, at, c, r, rm in rows]


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
        "UPDATE accounts SET head = ?, last_run_seq = ?, stored_bytes = stored_bytes - ?,"
        " collected_versions = collected_versions + ?, collected_bytes = collected_bytes + ?"
        " WHERE id = ?",
        (run, run, size, len(taken), size, account_id),
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


def flag_if_runs(tx: Transaction, account_id: int, device_id: str) -> None:
    """A device added after a run resyncs first: it may be a copy of an older replica
    holding what the run's tombstones replaced, and the run's ghosts may be gone."""
    tx.run(
        "UPDATE devices SET resync = 1 WHERE account = ? AND id = ?"
        " AND (SELECT last_run_seq FROM accounts WHERE id = ?) > 0",
        (account_id, device_id, account_id),
    )


def start_resync(tx: Transaction, name: str, device_id: str, now_ms: int) -> None:
    """A flagged device's full resync begins (its first pull from 0 since it was flagged,
    or since a run overtook it): runs wait for it, within `RESYNC_GRACE_MS` of then."""
    tx.run(
        "UPDATE devices SET resync_ms = ? WHERE id = ? AND resync = 1 AND resync_ms IS NULL"
        " AND account = (SELECT id FROM accounts WHERE name = ?)",
        (now_ms, device_id, name),
    )


def account_to_pull(
    tx: Transaction, name: str, device_id: str | None, resync: bool
) -> tuple[int, str, int, int]:
    """(id, epoch, head, last run) of the account a pull reads; `ResyncRequiredError` for a
    device flagged to resync pulling as usual (one statement: pulls are the hot path)."""
    row = tx.one(
        "SELECT a.id, a.epoch, a.head, a.last_run_seq, (SELECT d.resync FROM devices d"
        " WHERE d.account = a.id AND d.id = ?) FROM accounts a WHERE a.name = ?",
        (device_id, name),
    )
    if row is None:
        raise NotFoundError("no such account")
    account_id, epoch, head, last_run, flagged = row
    if flagged and not resync:
        raise ResyncRequiredError()
    return account_id, epoch, head, last_run


def resync_refusal(
    tx: Transaction, account_id: int, device_id: str, envelopes: int, ack: int | None
) -> ResyncRequiredError | None:
    """A flagged device's signed push (`record_push` found the flag): the empty one that
    acks at least the latest run, at the end of a resync no run overtook, ends it; any
    other is refused."""
    row = tx.one(
        "SELECT d.resync, d.resync_ms, a.last_run_seq FROM devices d"
        " JOIN accounts a ON a.id = d.account WHERE d.account = ? AND d.id = ?",
        (account_id, device_id),
    )
    if row is None or not row[0]:
        return None
    if envelopes or ack is None or ack < row[2] or row[1] is None:
        return ResyncRequiredError()
    tx.run(
        "UPDATE devices SET resync = 0, resync_ms = NULL WHERE account = ? AND id = ?",
        (account_id, device_id),
    )
    return None


def standings_by_account(tx: Transaction, name: str | None) -> dict[int, list[Standing]]:
    """`standings` of every account's devices (or only account `name`'s), in one query."""
    rows = tx.all(
        "SELECT d.account, d.id, d.ack_seq, d.ack_ms, d.created_ms, d.resync, d.resync_ms"
        " FROM devices d JOIN accounts a ON a.id = d.account"
        " WHERE CAST(? AS TEXT) IS NULL OR a.name = ?",
        (name, name),
    )
    by_account: dict[int, list[Standing]] = {}
    for account, i, a, at, c, r, rm in rows:
        by_account.setdefault(account, []).append(Standing(i, a, at, c, bool(r), rm))
    return by_account


def summary(
    row: tuple[Any, ...], devices: list[Standing], now_ms: int, horizon_ms: int | None
) -> AccountSummary:
    """An account's line of `accounts`, from its row there and its devices' standings."""
    (_, name, created_ms, count, versions, size, head, tombs, tomb_bytes,
     collected, collected_bytes, resyncing) = row  # fmt: skip
    floor, held_back_by = waited_for(devices, now_ms, horizon_ms)
    return AccountSummary(name, created_ms, count, versions, size, head, tombs, tomb_bytes,
                          floor, collected, collected_bytes, held_back_by, resyncing)  # fmt: skip
