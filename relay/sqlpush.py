"""The statements of a push, shared by every SQL backend (`relay.sql`): reading the stored
versions of a batch's keys, authorizing the batch under the account's lock, and writing what
`relay.versions.PushPlan` decided.
"""

from __future__ import annotations

from dataclasses import dataclass

from relay.dialect import Transaction
from relay.errors import CounterStaleError, RelayError, UnauthorizedError
from relay.signing import BundleKeys, Pusher, authorize_push, refuse_epochs_ahead, reseal_epoch
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
    accept_unsigned: bool
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
    rows = tx.all_in(STORED_VERSIONS, (account_id,), list(dict.fromkeys(keys)))
    for key, seq, node, hlc, vector, digest, size in rows:
        version = StoredVersion(seq, node_from_i64(node), hlc, decode_vector(vector), digest, size)
        found.setdefault(key, []).append(version)

    def epoch_of(seq: int) -> int:
        row = tx.one(
            "SELECT envelope FROM versions WHERE account = ? AND seq = ?", (account_id, seq)
        )
        assert row is not None, "a sibling just read, under the account's lock"
        return parse_header(bytes(row[0])).epoch

    return PushPlan(head, stored_bytes, found, epoch_of, reseal_epoch(account_keys))


def authorized(
    tx: Transaction, account_id: int, keys: BundleKeys, state: RelayState, push: PendingPush
) -> list[Header | Receipt]:
    """The push's checked headers once the account's key is found to have signed it (its
    counter then recorded), with every envelope of a key epoch not reached refused."""
    if authorize_push(push.name, keys, state, push.batch, push.pusher, push.accept_unsigned):
        assert push.pusher is not None, "a signed push has its pusher"
        record_counter(tx, account_id, push.pusher.device_id, push.batch.counter)
    return refuse_epochs_ahead(keys, push.checked)


def record_counter(tx: Transaction, account_id: int, device_id: str, counter: int) -> None:
    """Take `counter` as the device's last, or raise `CounterStaleError` with the last one
    when it is not above it (`UnauthorizedError` when the device was revoked meanwhile)."""
    if tx.run(
        "UPDATE devices SET push_counter = ? WHERE account = ? AND id = ? AND push_counter < ?",
        (counter, account_id, device_id, counter),
    ):
        return
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
            (account_id, seq, h.key, node_to_i64(h.node), h.hlc, h.vector_bytes, d, e)
            for seq, (h, e, d) in plan.inserted.items()
        ]
    )
    tx.run(
        "UPDATE accounts SET head = ?, stored_bytes = ? WHERE id = ?",
        (plan.head, plan.stored_bytes, account_id),
    )
