"""The statements of a push, shared by every SQL backend (`relay.sql`): reading the stored
versions of a batch's keys, authorizing the batch under the account's lock, and writing what
`relay.versions.PushPlan` decided.
"""

from __future__ import annotations

from dataclasses import dataclass

from relay.dialect import Transaction
from relay.errors import CounterStaleError, RelayError, UnauthorizedError
from relay.signing import BundleKeys, Pusher, authorize_push, refuse_epochs_ahead, reseal_epoch
from relay.sqlcollect import ghosts_of, resync_refusal
from relay.versions import PushPlan, StoredVersion
from replica.wire import (
    Header,
    PushBatch,
    Receipt,
    RelayState,
    decode_vector,
    node_from_i64,
    node_to_i64,
    parse_header,
)


@dataclass
class PendingPush:
    """A push on its way into a transaction: headers parsed, and, after `_apply_push`, the
    refusal to raise once the transaction commits (so the push's counter is kept)."""

    name: str
    batch: PushBatch
    pusher: Pusher | None
    checked: list[Header | Receipt]
    tombs: list[bool]
    """The tombstone bits as sent: they count only once the push is found signed."""
    accept_unsigned: bool
    received_ms: int
    refusal: RelayError | None = None


STORED_VERSIONS = (
    "SELECT key, seq, node, hlc, vector, digest, length(envelope) FROM versions"
    " WHERE account = ? AND key = ANY(?)"
)
"""The stored versions of a batch's keys, without their envelopes."""


def push_plan(
    tx: Transaction,
    account_id: int,
    head: int,
    stored_bytes: int,
    keys: list[bytes],
    account_keys: BundleKeys,
) -> PushPlan:
    """A plan over the stored versions of a batch's keys, read at once without envelopes; a
    stored envelope is read only for its key epoch (`relay.versions.EpochOf`)."""
    found: dict[bytes, list[StoredVersion]] = {}
    unique = list(dict.fromkeys(keys))
    rows = tx.all_in(STORED_VERSIONS, (account_id,), unique)
    for key, seq, node, hlc, vector, digest, size in rows:
        version = StoredVersion(seq, node_from_i64(node), hlc, decode_vector(vector), digest, size)
        found.setdefault(key, []).append(version)

    def epoch_of(seq: int) -> int:
        row = tx.one(
            "SELECT envelope FROM versions WHERE account = ? AND seq = ?", (account_id, seq)
        )
        assert row is not None, "a sibling just read, under the account's lock"
        return parse_header(bytes(row[0])).epoch

    ghosts = ghosts_of(tx, account_id, unique)
    return PushPlan(head, stored_bytes, found, epoch_of, reseal_epoch(account_keys), ghosts)


def authorized(
    tx: Transaction, account_id: int, keys: BundleKeys, state: RelayState, push: PendingPush
) -> tuple[list[Header | Receipt], list[bool]]:
    """The push's checked headers once the account's key is found to have signed it (its
    counter and ack then recorded), with every envelope of a key epoch not reached refused;
    and its tombstone flags (all false unless signed: only a key holder declares them)."""
    batch = push.batch
    if not authorize_push(push.name, keys, state, batch, push.pusher, push.accept_unsigned):
        return refuse_epochs_ahead(keys, push.checked), [False] * len(batch.envelopes)
    assert push.pusher is not None, "a signed push has its pusher"
    ack = None if batch.ack is None else min(batch.ack, state.head)
    device_id = push.pusher.device_id
    if record_push(tx, account_id, device_id, batch.counter, ack, push.received_ms):
        push.refusal = resync_refusal(tx, account_id, device_id, len(batch.envelopes), ack)
    return refuse_epochs_ahead(keys, push.checked), push.tombs


def record_push(
    tx: Transaction, account_id: int, device_id: str, counter: int, ack: int | None, now_ms: int
) -> bool:
    """Take `counter` as the device's last, or raise `CounterStaleError` with the last one
    when it is not above it (`UnauthorizedError` when the device was revoked meanwhile); and
    `ack` (at most the head) as how far it pulled now: as sent, even below what it said
    before (a repair or a restored file pulls again from lower down). Whether the device is
    flagged to resync (read by the same statement)."""
    acked = ""
    values: tuple[int, ...] = ()
    if ack is not None:
        acked = ", ack_seq = ?, ack_ms = ?"
        values = (ack, now_ms)
    flagged = tx.one(
        f"UPDATE devices SET push_counter = ?{acked} WHERE account = ? AND id = ?"
        " AND push_counter < ? RETURNING resync",
        (counter, *values, account_id, device_id, counter),
    )
    if flagged is not None:
        return bool(flagged[0])
    row = tx.one(
        "SELECT push_counter FROM devices WHERE account = ? AND id = ?", (account_id, device_id)
    )
    if row is None:
        raise UnauthorizedError()
    raise CounterStaleError(counter, row[0])


def write_plan(tx: Transaction, account_id: int, plan: PushPlan) -> None:
    """Carry out a decided push: delete what it dominates, insert what it stores."""
    tx.run_in(
        "DELETE FROM versions WHERE account = ? AND seq = ANY(?)", (account_id,), plan.deleted
    )
    tx.insert_versions(
        [
            (account_id, seq, h.key, node_to_i64(h.node), h.hlc, h.vector_bytes, d, e, int(tomb))
            for seq, (h, e, d, tomb) in plan.inserted.items()
        ]
    )
    tx.run_in(
        "UPDATE versions SET tomb = 1 WHERE account = ? AND seq = ANY(?)",
        (account_id,),
        plan.declared,
    )
    tx.run(
        "UPDATE accounts SET head = ?, stored_bytes = ? WHERE id = ?",
        (plan.head, plan.stored_bytes, account_id),
    )
