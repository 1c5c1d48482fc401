"""The in-memory reference relay: the behaviour every relay storage backend must match.

Synchronous and built on `replica.wire` alone (no keys, no decryption). Per account it keeps,
for each opaque key, exactly the versions no other stored version of that key dominates, each
with a sequence number; pushes get one receipt per envelope; pulls return pages in seq order.
Every answer carries the relay state (storage id, account epoch, head) that lets a device
detect a wipe (`wipe`), a restore from an older copy (`snapshot` / `restore`) or a reseed.
Data operations create an account on first use, so replica tests need no registration.
"""

from __future__ import annotations

import bisect
import copy
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from relay.collection import check_horizon, check_run_bounds, page_end, split, to_flag
from relay.errors import (
    AccountExistsError,
    CounterStaleError,
    ForbiddenError,
    NotFoundError,
    QuotaExceededError,
    UnauthorizedError,
)
from relay.memaccount import MemoryAccount
from relay.memcollect import candidates
from relay.signing import BundleKeys, Pusher, authorize_push, refuse_epochs_ahead, reseal_epoch
from relay.storage import (
    DEFAULT_MAX_ACCOUNT_BYTES,
    DEFAULT_MAX_DRIFT_MS,
    DEFAULT_MAX_PAGE_BYTES,
    DEFAULT_PAGE_SIZE,
    AccountRecord,
    AccountSummary,
    CollectReport,
    CommitObserver,
    Device,
    HeadListener,
    LoginFailures,
    TokenRecord,
    VersionRules,
    new_random_id,
    refresh_step,
    spent_until,
)
from relay.versions import (
    Store,
    check_envelope,
    cut_page,
    decide,
    declared_tombstones,
    is_over_quota,
    new_version,
    page_bounds,
)
from replica.errors import InvalidArgumentError
from replica.wire import (
    MAX_RUN_MARKERS,
    Header,
    KdfParams,
    Page,
    PageEntry,
    PushBatch,
    PushResult,
    Receipt,
    RelayState,
    parse_header,
)

U32_MAX = 2**32 - 1


@dataclass(frozen=True)
class _Snapshot:
    storage_id: str
    accounts: dict[str, MemoryAccount]
    tokens: dict[bytes, TokenRecord]


def _same_device(a: TokenRecord, b: TokenRecord) -> bool:
    return (a.account, a.device_id) == (b.account, b.device_id)


class MemoryRelay:
    """A relay held in dicts; `clock_ms` is injected so drift refusals are testable."""

    def __init__(
        self,
        *,
        clock_ms: Callable[[], int],
        max_drift_ms: int = DEFAULT_MAX_DRIFT_MS,
        page_size: int = DEFAULT_PAGE_SIZE,
        max_account_bytes: int = DEFAULT_MAX_ACCOUNT_BYTES,
        max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES,
        accept_unsigned_pushes: bool = False,
        new_id: Callable[[], str] = new_random_id,
    ) -> None:
        self._rules = VersionRules(
            clock_ms,
            max_drift_ms,
            page_size,
            max_account_bytes,
            max_page_bytes,
            accept_unsigned_pushes,
        )
        self._new_id = new_id
        self._storage_id = new_id()
        self._secret = secrets.token_bytes(32)
        self._accounts: dict[str, MemoryAccount] = {}
        self._tokens: dict[bytes, TokenRecord] = {}
        self._revoked_tokens: dict[bytes, str] = {}
        """hash → account name of each token a revoked device held."""
        self._invites: dict[bytes, int] = {}
        self._login_failures: dict[str, list[tuple[str, int]]] = {}
        """name → (address, at_ms) of each failed login still remembered."""
        self._listeners: list[HeadListener] = []
        self._commit_observers: list[CommitObserver] = []
        self._mutex = threading.RLock()

    @property
    def storage_id(self) -> str:
        return self._storage_id

    @property
    def secret(self) -> bytes:
        return self._secret

    # -- accounts ---------------------------------------------------------------------------

    def _account(self, name: str) -> MemoryAccount:
        account = self._accounts.get(name)
        if account is None:
            account = self._accounts[name] = MemoryAccount(epoch=self._new_id())
        return account

    def create_account(
        self,
        account: AccountRecord,
        device: Device,
        tokens: list[TokenRecord],
        invite_hash: bytes | None,
        now_ms: int,
    ) -> RelayState:
        with self._mutex:
            # the invite first: without a usable one, a taken name and a free one look alike
            if invite_hash is not None and self._invites.get(invite_hash, -1) < now_ms:
                raise ForbiddenError("the invite is unknown, used or expired")
            existing = self._accounts.get(account.name)
            if existing is not None and existing.record is not None:
                raise AccountExistsError(f"account {account.name!r} already exists")
            if invite_hash is not None:
                del self._invites[invite_hash]
            entry = self._account(account.name)
            entry.record = account
            entry.devices[device.id] = device
            self._tokens.update((t.hash, t) for t in tokens)
            return self.state(account.name)

    def account(self, name: str) -> AccountRecord | None:
        with self._mutex:
            entry = self._accounts.get(name)
            return entry.record if entry else None

    def delete_account(self, name: str) -> bool:
        with self._mutex:
            entry = self._accounts.pop(name, None)
            self._tokens = {h: t for h, t in self._tokens.items() if t.account != name}
            self._revoked_tokens = {h: a for h, a in self._revoked_tokens.items() if a != name}
            return entry is not None and entry.record is not None

    def put_key_bundle(
        self,
        name: str,
        expected_version: int,
        bundle: bytes,
        kdf: KdfParams,
        auth_hash: bytes,
        *,
        only_device: str | None = None,
        revoke_device: str | None = None,
        recovery_hash: bytes | None = None,
    ) -> int | None:
        with self._mutex:
            entry = self._accounts.get(name)
            if entry is None or entry.record is None:
                return None
            if entry.record.bundle_version != expected_version:
                return None
            if revoke_device is not None and not self.revoke_device(name, revoke_device):
                raise NotFoundError("no such device")
            version = expected_version + 1
            entry.record = replace(
                entry.record,
                bundle=bundle,
                kdf=kdf,
                auth_hash=auth_hash,
                recovery_hash=recovery_hash or entry.record.recovery_hash,
                bundle_version=version,
            )
            if only_device is not None:
                self._tokens = {
                    h: t
                    for h, t in self._tokens.items()
                    if t.account != name or t.device_id == only_device
                }
            return version

    def add_invite(self, invite_hash: bytes, expires_ms: int) -> None:
        with self._mutex:
            now = self._rules.clock_ms()
            self._invites = {h: e for h, e in self._invites.items() if e >= now}
            self._invites[invite_hash] = expires_ms

    def accounts(
        self, name: str | None = None, *, horizon_ms: int | None = None
    ) -> list[AccountSummary]:
        check_horizon(horizon_ms)
        now_ms = self._rules.clock_ms()
        with self._mutex:
            return [
                entry.summary(account, record.created_ms, now_ms, horizon_ms)
                for account, entry in sorted(self._accounts.items())
                if (record := entry.record) is not None and name in (None, account)
            ]

    def login_failures(self, name: str, address: str, since_ms: int) -> LoginFailures:
        with self._mutex:
            recent = [(a, at) for a, at in self._login_failures.get(name, []) if at > since_ms]
        mine = [at for a, at in recent if a == address]
        return LoginFailures(len(mine), len(recent), min(mine, default=None))

    def add_login_failure(self, name: str, address: str, at_ms: int, forget_before_ms: int) -> None:
        with self._mutex:
            kept = {
                n: [(a, at) for a, at in failures if at > forget_before_ms]
                for n, failures in self._login_failures.items()
            }
            self._login_failures = {n: failures for n, failures in kept.items() if failures}
            self._login_failures.setdefault(name, []).append((address, at_ms))

    def clear_login_failures(self, name: str, address: str) -> None:
        with self._mutex:
            failures = self._login_failures.get(name, [])
            failures[:] = [(a, at) for a, at in failures if a != address]

    # -- devices and tokens -----------------------------------------------------------------

    def add_device(self, name: str, device: Device, tokens: list[TokenRecord]) -> None:
        with self._mutex:
            entry = self._account(name)
            if any(t.device_id not in {device.id, *entry.devices} for t in tokens):
                raise NotFoundError("no such device")  # as the SQL backends' foreign key
            entry.devices[device.id] = device
            if entry.runs.last_run_seq:  # `relay.sqlcollect.flag_if_runs`
                entry.runs.resync[device.id] = None
            self._tokens.update((t.hash, t) for t in tokens)

    def renew_device(self, name: str, device_id: str, tokens: list[TokenRecord]) -> bool:
        with self._mutex:
            entry = self._accounts.get(name)
            if entry is None or device_id not in entry.devices:
                return False
            self._tokens = {
                h: t
                for h, t in self._tokens.items()
                if (t.account, t.device_id) != (name, device_id)
            }
            self._tokens.update((t.hash, t) for t in tokens)
            return True

    def devices(self, name: str) -> list[Device]:
        with self._mutex:
            entry = self._accounts.get(name)
            return sorted(entry.devices.values(), key=lambda d: d.id) if entry else []

    def rename_device(self, name: str, device_id: str, new_name: str) -> bool:
        if "\0" in device_id:  # no device has one: PostgreSQL TEXT cannot even hold it
            return False
        with self._mutex:
            entry = self._accounts.get(name)
            if entry is None or device_id not in entry.devices:
                return False
            entry.devices[device_id] = replace(entry.devices[device_id], name=new_name)
            return True

    def revoke_device(self, name: str, device_id: str, *, own: bool = False) -> bool:
        if "\0" in device_id:  # no device has one: PostgreSQL TEXT cannot even hold it
            return False
        with self._mutex:
            entry = self._accounts.get(name)
            if entry is None or entry.devices.pop(device_id, None) is None:
                return False
            entry.runs.resync.pop(device_id, None)
            held = {
                h for h, t in self._tokens.items() if (t.account, t.device_id) == (name, device_id)
            }
            self._revoked_tokens.update((h, name) for h in held if not own)
            self._tokens = {h: t for h, t in self._tokens.items() if h not in held}
            return True

    def token(self, token_hash: bytes) -> TokenRecord | None:
        with self._mutex:
            token = self._tokens.get(token_hash)
            return token if token is not None and self._has_device(token) else None

    def is_revoked_token(self, token_hash: bytes) -> bool:
        with self._mutex:
            return token_hash in self._revoked_tokens

    def replace_token(
        self, old_hash: bytes, tokens: list[TokenRecord], grace_until_ms: int
    ) -> bool:
        """Like the SQL backends' foreign key: no successor for a device that is gone."""
        with self._mutex:
            old = self._tokens.get(old_hash)
            if old is None or not all(map(self._has_device, tokens)):
                return False
            now = self._rules.clock_ms()
            mine = [t for t in self._tokens.values() if _same_device(t, old)]
            spent = [t.expires_ms for t in mine if t.kind == "spent" and t.hash != old_hash]
            latest = max(spent, default=None)
            step = refresh_step(old.kind, old.expires_ms, latest, now)
            if step == "refuse":
                if old.kind == "spent":  # a used token used again, out of turn: a copy is loose
                    for t in mine:
                        del self._tokens[t.hash]
                return False
            if step == "spend":
                until = spent_until(grace_until_ms, latest)
                self._tokens[old_hash] = replace(old, kind="spent", expires_ms=until)
            else:  # the reply was lost: the successors it carried were never received
                for t in mine:
                    if t.kind != "spent":
                        del self._tokens[t.hash]
            self._tokens = {  # the device's expired tokens go with each refresh
                h: t
                for h, t in self._tokens.items()
                if t.expires_ms > now or not _same_device(t, old)
            }
            self._tokens.update((t.hash, t) for t in tokens)
            return True

    def _has_device(self, token: TokenRecord) -> bool:
        entry = self._accounts.get(token.account)
        return entry is not None and token.device_id in entry.devices

    # -- state, wipe and restore ------------------------------------------------------------

    def state(self, name: str) -> RelayState:
        with self._mutex:
            account = self._account(name)
            return RelayState(self._storage_id, account.epoch, account.head)

    def reseed(self, name: str) -> RelayState:
        with self._mutex:
            self._account(name).epoch = self._new_id()
            return self.state(name)

    def wipe(self) -> None:
        """Lose everything, as a fresh database would: a new storage id."""
        with self._mutex:
            self._storage_id = self._new_id()
            self._accounts, self._tokens, self._invites = {}, {}, {}

    def snapshot(self) -> object:
        """A copy of the whole relay, for `restore` (a restore from an older backup)."""
        with self._mutex:
            return _Snapshot(self._storage_id, copy.deepcopy(self._accounts), dict(self._tokens))

    def restore(self, snapshot: object) -> None:
        if not isinstance(snapshot, _Snapshot):
            raise InvalidArgumentError("restore takes a value returned by snapshot()")
        with self._mutex:
            copied = copy.deepcopy(snapshot)
            self._storage_id, self._accounts = copied.storage_id, copied.accounts
            self._tokens = copied.tokens

    def stored_versions(self, name: str) -> int:
        with self._mutex:
            return len(self._account(name).by_seq)

    def listen(self, listener: HeadListener) -> None:
        self._listeners.append(listener)

    def observe_commits(self, observer: CommitObserver) -> None:
        self._commit_observers.append(observer)

    def close(self) -> None:
        """Nothing to release: the relay lives as long as the object."""

    # -- push -------------------------------------------------------------------------------

    def push(self, name: str, batch: PushBatch, pusher: Pusher | None = None) -> PushResult:
        with self._mutex:
            account = self._account(name)
            before = account.head
            keys, tombs = self._authorized(name, account, batch, pusher)
            saved = (account.stored_bytes, dict(account.by_key), dict(account.by_seq))
            saved_tombs = set(account.tombs)
            now_ms = self._rules.clock_ms()
            drift_ms = self._rules.max_drift_ms
            checked = refuse_epochs_ahead(
                keys, [check_envelope(e, now_ms, drift_ms) for e in batch.envelopes]
            )
            reseal_into = self._reseal_epoch(account, keys)
            receipts = [
                self._push_one(account, h, e, reseal_into, tomb)
                for h, e, tomb in zip(checked, batch.envelopes, tombs, strict=True)
            ]
            if is_over_quota(account.stored_bytes, saved[0], self._rules.max_account_bytes):
                account.stored_bytes, account.by_key, account.by_seq = saved
                account.tombs = saved_tombs
                account.head = before
                del account.seqs[bisect.bisect_right(account.seqs, before) :]
                raise QuotaExceededError(
                    f"the batch would take the account past its quota of "
                    f"{self._rules.max_account_bytes} bytes"
                )
            result = PushResult(receipts, self.state(name))
        for observer in self._commit_observers:
            observer(1)
        if account.head != before:
            for listener in self._listeners:
                listener(name, account.head)
        return result

    def _authorized(
        self, name: str, account: MemoryAccount, batch: PushBatch, pusher: Pusher | None
    ) -> tuple[BundleKeys, list[bool]]:
        """The account's keys once the push is authorized, its counter and ack recorded (an
        account made by a push alone, as the sans-I/O tests make them, has none and takes
        unsigned pushes: no device of it can sign); and its tombstone flags (only a signed
        push declares any, `relay.sqlpush.authorized`)."""
        tombs = declared_tombstones(batch)
        keys = account.record.keys if account.record is not None else BundleKeys()
        state = RelayState(self._storage_id, account.epoch, account.head)
        unsigned = account.record is None or self._rules.accept_unsigned_pushes
        if not authorize_push(name, keys, state, batch, pusher, unsigned):
            return keys, [False] * len(batch.envelopes)
        assert pusher is not None, "a signed push has its pusher"
        if pusher.device_id not in account.devices:
            raise UnauthorizedError()
        last = account.push_counters.get(pusher.device_id, 0)
        if batch.counter <= last:
            raise CounterStaleError(batch.counter, last)
        account.push_counters[pusher.device_id] = batch.counter
        ack = None if batch.ack is None else min(batch.ack, account.head)
        if ack is not None:  # as sent: a repair may have taken the cursor back
            account.acks[pusher.device_id] = (ack, self._rules.clock_ms())
        account.runs.check_push(pusher.device_id, len(batch.envelopes), ack)
        return keys, tombs

    @staticmethod
    def _reseal_epoch(account: MemoryAccount, keys: BundleKeys) -> int | None:
        """`signing.reseal_epoch`; an account made by a push alone (the sans-I/O tests) has no
        keys to bound it, and takes a later sealing under any epoch, as a device pushes it."""
        return U32_MAX if account.record is None else reseal_epoch(keys)

    def _push_one(
        self,
        account: MemoryAccount,
        header: Header | Receipt,
        envelope: bytes,
        reseal_into: int | None,
        tomb: bool,
    ) -> Receipt:
        if isinstance(header, Receipt):
            return header
        siblings = account.by_key.get(header.key, [])

        def epoch_of(seq: int) -> int:
            return parse_header(account.by_seq[seq]).epoch

        ghosts = account.runs.ghosts_of(header.key)
        decision = decide(header, envelope, siblings, epoch_of, reseal_into, ghosts)
        if not isinstance(decision, Store):
            if tomb and decision.seq is not None:
                account.tombs.add(decision.seq)  # sent again, as a tombstone
            return decision
        for seq in decision.dominated:
            account.stored_bytes -= len(account.by_seq.pop(seq))
            account.tombs.discard(seq)
        account.head += 1
        new = new_version(account.head, header, envelope)
        account.by_key[header.key] = [
            *(s for s in siblings if s.seq not in decision.dominated),
            new,
        ]
        account.by_seq[new.seq] = envelope
        if tomb:
            account.tombs.add(new.seq)
        account.seqs.append(new.seq)
        account.stored_bytes += len(envelope)
        return Receipt("stored", seq=new.seq)

    # -- pull -------------------------------------------------------------------------------

    def pull(
        self,
        name: str,
        cursor: int,
        limit: int | None = None,
        *,
        device_id: str | None = None,
        resync: bool = False,
    ) -> Page:
        count = page_bounds(cursor, limit, self._rules.page_size)
        with self._mutex:
            account = self._account(name)
            account.runs.check_pull(device_id, resync, cursor, self._rules.clock_ms())
            run = account.runs.next_run(cursor)
            until = account.head if run is None else run - 1  # a page ends at a run
            sizes: list[tuple[int, int]] = []
            index = bisect.bisect_right(account.seqs, cursor)
            while index < len(account.seqs) and len(sizes) <= count:
                seq = account.seqs[index]
                if seq > until:
                    break
                stored = account.by_seq.get(seq)
                if stored is not None:  # compacted seqs are gaps
                    sizes.append((seq, len(stored)))
                index += 1
            kept, has_more = cut_page(sizes, count, self._rules.max_page_bytes)
            entries = [PageEntry(seq, account.by_seq[seq]) for seq, _ in sizes[:kept]]
            collected = None
            if run is not None and not has_more:  # the page reached the run: its markers
                collected = account.runs.markers(run)
            next_cursor, has_more = page_end(entries, has_more, run, account.head, cursor)
            self._compact_seqs(account)
            state, last_run = self.state(name), account.runs.last_run_seq
        return Page(cursor, entries, next_cursor, has_more, state, collected, last_run)

    # -- collection -------------------------------------------------------------------------

    def collect(
        self, name: str, *, limit: int = MAX_RUN_MARKERS, horizon_ms: int | None = None
    ) -> CollectReport:
        check_run_bounds(limit, horizon_ms)
        with self._mutex:
            account = self._accounts.get(name)
            if account is None:  # a run creates no account, unlike a push
                raise NotFoundError("no such account")
            runs = account.runs
            standings = runs.standings(account.devices.values(), account.acks)
            floor, stale = split(standings, self._rules.clock_ms(), horizon_ms)
            if floor is None:
                return CollectReport(name, None, None, 0, 0, 0)
            released = runs.release(floor)
            taken = candidates(account.tombs, account.by_seq, account.by_key, floor, limit)
            last = account.head + 1 if taken else max(released, default=None)
            runs.flag(flagged := to_flag(stale, last), last)
            if not taken:
                return CollectReport(name, floor, None, 0, 0, len(released), len(flagged))
            account.head = run = account.head + 1
            size = runs.add(run, taken, account.by_seq, account.by_key, account.tombs)
            account.stored_bytes -= size
        for listener in self._listeners:
            listener(name, run)
        return CollectReport(name, floor, run, len(taken), size, len(released), len(flagged))

    @staticmethod
    def _compact_seqs(account: MemoryAccount) -> None:
        if len(account.seqs) > 2 * len(account.by_seq) + 1024:
            account.seqs = sorted(account.by_seq)
