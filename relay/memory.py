"""The in-memory reference relay: the behaviour every relay storage backend must match.

Synchronous and built on `replica.wire` alone (no keys, no decryption). Per account it keeps,
for each opaque key, exactly the versions no other stored version of that key dominates, each
with a sequence number; pushes get one receipt per envelope; pulls return pages in seq order.
Every answer carries the relay state (storage id, account epoch, head) that lets a device
detect a wipe (`wipe`), a restore from an older copy (`snapshot` / `restore`) or a reseed.
"""

from __future__ import annotations

import bisect
import copy
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from replica.errors import InvalidArgumentError, ProtocolError
from replica.wire import (
    Header,
    Page,
    PageEntry,
    PushBatch,
    PushResult,
    Receipt,
    RelayState,
    dominates,
    hlc_ms,
    parse_header,
)

DEFAULT_PAGE_SIZE = 1000
DEFAULT_MAX_DRIFT_MS = 5 * 60 * 1000


@dataclass
class _Stored:
    seq: int
    header: Header
    envelope: bytes


@dataclass
class _Account:
    epoch: str
    head: int = 0
    by_key: dict[bytes, list[_Stored]] = field(default_factory=dict)
    by_seq: dict[int, _Stored] = field(default_factory=dict)
    seqs: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class _Snapshot:
    storage_id: str
    accounts: dict[str, _Account]


def _random_id() -> str:
    return secrets.token_hex(16)


class MemoryRelay:
    """A relay held in a dict; `clock_ms` is injected so drift refusals are testable."""

    def __init__(
        self,
        *,
        clock_ms: Callable[[], int],
        max_drift_ms: int = DEFAULT_MAX_DRIFT_MS,
        page_size: int = DEFAULT_PAGE_SIZE,
        new_id: Callable[[], str] = _random_id,
    ) -> None:
        self._clock_ms = clock_ms
        self._max_drift_ms = max_drift_ms
        self._page_size = page_size
        self._new_id = new_id
        self.storage_id = new_id()
        self._accounts: dict[str, _Account] = {}

    # -- accounts and state ---------------------------------------------------------------------

    def _account(self, name: str) -> _Account:
        account = self._accounts.get(name)
        if account is None:
            account = self._accounts[name] = _Account(epoch=self._new_id())
        return account

    def state(self, name: str) -> RelayState:
        account = self._account(name)
        return RelayState(self.storage_id, account.epoch, account.head)

    def reseed(self, name: str) -> RelayState:
        """Give the account a new epoch: every device then knows to push what it holds."""
        self._account(name).epoch = self._new_id()
        return self.state(name)

    def wipe(self) -> None:
        """Lose everything, as a fresh database would: a new storage id."""
        self.storage_id = self._new_id()
        self._accounts = {}

    def snapshot(self) -> object:
        """A copy of the whole relay, for `restore` (a restore from an older backup)."""
        return _Snapshot(self.storage_id, copy.deepcopy(self._accounts))

    def restore(self, snapshot: object) -> None:
        if not isinstance(snapshot, _Snapshot):
            raise InvalidArgumentError("restore takes a value returned by snapshot()")
        copied = copy.deepcopy(snapshot)
        self.storage_id, self._accounts = copied.storage_id, copied.accounts

    def stored_versions(self, name: str) -> int:
        return len(self._account(name).by_seq)

    # -- push -----------------------------------------------------------------------------------

    def push(self, name: str, batch: PushBatch) -> PushResult:
        account = self._account(name)
        receipts = [self._push_one(account, envelope) for envelope in batch.envelopes]
        return PushResult(receipts, self.state(name))

    def _push_one(self, account: _Account, envelope: bytes) -> Receipt:
        try:
            header = parse_header(envelope)
        except ProtocolError:
            return Receipt("refused", code="malformed")
        if hlc_ms(header.hlc) > self._clock_ms() + self._max_drift_ms:
            return Receipt("refused", code="clock_ahead")
        siblings = account.by_key.get(header.key, [])
        for stored in siblings:
            if stored.header.dot == header.dot:
                if stored.envelope != envelope:
                    return Receipt("refused", code="identity_conflict")
                return Receipt("stored", seq=stored.seq)
            if dominates(stored.header.vector, header.dot):
                return Receipt("superseded")
        kept = []
        for stored in siblings:
            if dominates(header.vector, stored.header.dot):
                del account.by_seq[stored.seq]
            else:
                kept.append(stored)
        account.head += 1
        new = _Stored(account.head, header, envelope)
        kept.append(new)
        account.by_key[header.key] = kept
        account.by_seq[new.seq] = new
        account.seqs.append(new.seq)
        return Receipt("stored", seq=new.seq)

    # -- pull -----------------------------------------------------------------------------------

    def pull(self, name: str, cursor: int, limit: int | None = None) -> Page:
        if cursor < 0:
            raise InvalidArgumentError(f"cursor {cursor} must be ≥ 0")
        if limit is not None and limit < 1:
            raise InvalidArgumentError(f"page limit {limit} must be ≥ 1")
        limit = min(limit or self._page_size, self._page_size)
        account = self._account(name)
        entries: list[PageEntry] = []
        index = bisect.bisect_right(account.seqs, cursor)
        while index < len(account.seqs) and len(entries) < limit:
            stored = account.by_seq.get(account.seqs[index])
            if stored is not None:
                entries.append(PageEntry(stored.seq, stored.envelope))
            index += 1
        while index < len(account.seqs) and account.seqs[index] not in account.by_seq:
            index += 1  # skip compacted seqs, so has_more looks at one live entry at most
        has_more = index < len(account.seqs)
        next_cursor = entries[-1].seq if has_more else max(account.head, cursor)
        self._compact_seqs(account)
        return Page(cursor, entries, next_cursor, has_more, self.state(name))

    @staticmethod
    def _compact_seqs(account: _Account) -> None:
        if len(account.seqs) > 2 * len(account.by_seq) + 1024:
            account.seqs = sorted(account.by_seq)
