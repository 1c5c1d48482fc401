"""What a relay does with one pushed envelope, given the stored versions of its key.

Pure and shared by every storage backend, so the memory reference, SQLite and PostgreSQL
cannot drift apart: a backend reads the stored siblings of the envelope's opaque key, asks
`decide`, and carries the answer out inside its write transaction (specs/protocol.md §5).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import NamedTuple

import msgspec

from relay.collection import haunted
from relay.errors import InvalidError
from replica.errors import InvalidArgumentError, ProtocolError
from replica.wire import (
    ErrorCode,
    Header,
    PushBatch,
    PushResult,
    Receipt,
    VersionVector,
    dominates,
    hlc_ms,
    parse_header,
    tombstone_bits,
    tombstone_flags,
)


class StoredVersion(NamedTuple):
    """One version a backend holds: enough to decide dominance without the envelope body."""

    seq: int
    node: int
    hlc: int
    vector: VersionVector
    digest: bytes
    """SHA-256 of the envelope: the same identity with other bytes is told apart by it."""
    size: int


class Store(NamedTuple):
    """Store the envelope under a new seq and delete the stored versions it dominates."""

    header: Header
    dominated: list[int]
    """seqs of the stored versions of this key that the new version dominates."""


Decision = Receipt | Store
"""Either the receipt to answer at once (nothing written) or a write to carry out."""

MALFORMED = Receipt("refused", code=ErrorCode.MALFORMED)
CLOCK_AHEAD = Receipt("refused", code=ErrorCode.CLOCK_AHEAD)
IDENTITY_CONFLICT = Receipt("refused", code=ErrorCode.IDENTITY_CONFLICT)
SUPERSEDED = Receipt("superseded")


def envelope_sha256(envelope: bytes) -> bytes:
    """The SHA-256 of an envelope, as stored beside it (`StoredVersion.digest`)."""
    return hashlib.sha256(envelope).digest()


def new_version(seq: int, header: Header, envelope: bytes) -> StoredVersion:
    return StoredVersion(
        seq, header.node, header.hlc, header.vector, envelope_sha256(envelope), len(envelope)
    )


def check_envelope(envelope: bytes, now_ms: int, max_drift_ms: int) -> Header | Receipt:
    """The header of a pushed envelope, or the refusal it earns before any storage is read.

    The drift bound covers the whole vector, not only the version's own hlc: the relay
    compacts by the vector of a header it cannot authenticate, so an entry far in the future
    would let one push cover (and delete) every stored version of the key and the owner's
    next writes. A genuine version's entries are never above its own hlc (a device's clock
    ticks past everything it merged), so only a forged or broken one is refused for it."""
    try:
        header = parse_header(envelope)
    except ProtocolError:
        return MALFORMED
    if hlc_ms(max(header.vector.values())) > now_ms + max_drift_ms:  # the vector holds hlc
        return CLOCK_AHEAD
    return header


EpochOf = Callable[[int], int]
"""The key epoch of the stored version with this seq: read from its envelope only when the
same dot arrives with other bytes, so the common push never loads a stored envelope."""


def decide(
    header: Header,
    envelope: bytes,
    siblings: Sequence[StoredVersion],
    epoch_of: EpochOf,
    reseal_epoch: int | None,
    ghosts: Sequence[VersionVector] = (),
) -> Decision:
    """Idempotent on the version's identity (its dot); dropped only when a stored version of
    the same key dominates it; otherwise stored, replacing exactly the versions it dominates.

    The same dot with other bytes is one version sealed twice: after a rotation a device
    seals its own versions again under the account's current key epoch (replica/reseal.py).
    For a push signed by the account's key (`reseal_epoch`, its current epoch; None when
    nobody signs), a sealing under a higher epoch, at most the current one, with the same
    vector, replaces the stored one; an earlier sealing pushed again (by a reseed of a device
    that holds it) is stored already in the later. Anything else with other bytes is an
    `identity_conflict` (a copied replica writing as its original). What the `ghosts` of
    collected tombstones cover is superseded (`relay.collection.haunted`)."""
    node, hlc = header.node, header.hlc
    for stored in siblings:
        if stored.node == node and stored.hlc == hlc:
            if stored.digest == envelope_sha256(envelope):
                return Receipt("stored", seq=stored.seq)
            if reseal_epoch is None:
                return IDENTITY_CONFLICT
            stored_epoch = epoch_of(stored.seq)
            if stored_epoch == header.epoch or stored.vector != header.vector:
                return IDENTITY_CONFLICT
            if max(stored_epoch, header.epoch) > reseal_epoch:
                return IDENTITY_CONFLICT
            if stored_epoch > header.epoch:
                return Receipt("stored", seq=stored.seq)
            continue  # re-sealed: its vector dominates the earlier sealing, which it replaces
        if dominates(stored.vector, (node, hlc)):
            return SUPERSEDED
    if haunted(ghosts, node, hlc):
        return SUPERSEDED
    return Store(header, [s.seq for s in siblings if dominates(header.vector, (s.node, s.hlc))])


TOO_LARGE = Receipt("refused", code=ErrorCode.TOO_LARGE)


def declared_tombstones(batch: PushBatch) -> list[bool]:
    """Each envelope's tombstone bit; `InvalidError` for bits past the last envelope, checked
    before anything of the push is recorded."""
    try:
        return tombstone_flags(len(batch.envelopes), batch.tombstones)
    except ProtocolError as exc:
        raise InvalidError(str(exc)) from None


def within_bound(batch: PushBatch, max_envelope_bytes: int) -> PushBatch:
    """What of a push storage takes: the envelopes within the bound, with their tombstone
    bits (an oversized one is refused alone and blocks nothing else)."""
    flags = declared_tombstones(batch)
    kept = [
        (e, flag)
        for e, flag in zip(batch.envelopes, flags, strict=True)
        if len(e) <= max_envelope_bytes
    ]
    if len(kept) == len(batch.envelopes):
        return batch
    envelopes, bits = [e for e, _ in kept], tombstone_bits([flag for _, flag in kept])
    return msgspec.structs.replace(batch, envelopes=envelopes, tombstones=bits)


def with_oversized(batch: PushBatch, result: PushResult, max_envelope_bytes: int) -> PushResult:
    """`result` of `within_bound(batch)` with the oversized envelopes' refusals put back in
    their places."""
    if len(result.receipts) == len(batch.envelopes):
        return result
    stored = iter(result.receipts)
    receipts = [
        next(stored) if len(e) <= max_envelope_bytes else TOO_LARGE for e in batch.envelopes
    ]
    return PushResult(receipts, result.state)


def is_over_quota(stored_bytes: int, bytes_before: int, max_account_bytes: int) -> bool:
    """Whether a push must be refused: only one that grows the account past its quota, so an
    account over it (the operator lowered the bound) can still re-send and shrink."""
    return stored_bytes > max_account_bytes and stored_bytes > bytes_before


def page_bounds(cursor: int, limit: int | None, page_size: int) -> int:
    """The entry count of a pull: `limit` capped at the page size; bad arguments refused."""
    if cursor < 0:
        raise InvalidArgumentError(f"cursor {cursor} must be ≥ 0")
    if limit is not None and limit < 1:
        raise InvalidArgumentError(f"page limit {limit} must be ≥ 1")
    return min(limit or page_size, page_size)


def cut_page(sizes: Sequence[tuple[int, int]], count: int, max_bytes: int) -> tuple[int, bool]:
    """How many of the (seq, size) rows after a cursor make the page — at most `count`, at
    most `max_bytes` of envelopes but at least one — and whether more rows follow. Backends
    read sizes first, so a page never loads more than it sends."""
    total, kept = 0, 0
    for _, size in sizes[:count]:
        total += size
        if total > max_bytes and kept:
            break
        kept += 1
    return kept, kept < len(sizes)


class PushPlan:
    """A push carried out in memory against the stored versions of its keys, for a backend
    to write at once: one read and a few batched statements per request instead of several
    per envelope. Later envelopes of the batch see the earlier ones, as if pushed one by one."""

    def __init__(
        self,
        head: int,
        stored_bytes: int,
        siblings: dict[bytes, list[StoredVersion]],
        stored_epoch_of: EpochOf,
        reseal_epoch: int | None,
        ghosts: dict[bytes, list[VersionVector]] | None = None,
    ) -> None:
        self.head = head
        self.stored_bytes = stored_bytes
        self.siblings = siblings
        self.inserted: dict[int, tuple[Header, bytes, bytes, bool]] = {}
        """(header, envelope, digest, tombstone) by seq; a later envelope may take one out."""
        self.deleted: list[int] = []
        """seqs of versions stored before the batch that it dominates."""
        self.declared: list[int] = []
        """seqs of versions stored before the batch that it sent again as tombstones."""
        self._stored_epoch_of = stored_epoch_of
        self._reseal_epoch = reseal_epoch
        self._ghosts = ghosts or {}
        """The vectors of the tombstones retained runs collected, by key (`decide`)."""

    def _epoch_of(self, seq: int) -> int:
        inserted = self.inserted.get(seq)
        return inserted[0].epoch if inserted is not None else self._stored_epoch_of(seq)

    def add(self, header: Header, envelope: bytes, tomb: bool) -> Receipt:
        """Decide one envelope (`tomb`: declared a tombstone by a signed push)."""
        siblings = self.siblings.setdefault(header.key, [])
        ghosts = self._ghosts.get(header.key, ())
        decision = decide(header, envelope, siblings, self._epoch_of, self._reseal_epoch, ghosts)
        if not isinstance(decision, Store):
            if tomb and decision.seq is not None:
                self._declare(decision.seq)
            return decision
        for stored in siblings:
            if stored.seq in decision.dominated:
                self.stored_bytes -= stored.size
                if self.inserted.pop(stored.seq, None) is None:
                    self.deleted.append(stored.seq)
        self.head += 1
        version = new_version(self.head, header, envelope)
        self.stored_bytes += version.size
        self.inserted[self.head] = (header, envelope, version.digest, tomb)
        self.siblings[header.key] = [
            *(s for s in siblings if s.seq not in decision.dominated),
            version,
        ]
        return Receipt("stored", seq=self.head)

    def _declare(self, seq: int) -> None:
        """A version stored already, sent again as a tombstone: one stored before this
        protocol said so, or one this batch stored twice."""
        inserted = self.inserted.get(seq)
        if inserted is not None:
            self.inserted[seq] = (*inserted[:3], True)
        elif seq not in self.declared:
            self.declared.append(seq)
