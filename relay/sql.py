"""The relay's storage in SQL, written once for SQLite and PostgreSQL.

Accounts, devices, tokens, key bundles, pushes and pulls are the same statements on both
databases, written here once; a backend's `relay.dialect.Transaction` rewrites a statement
for its database but never restates it. What truly differs stays with each backend: SQLite's
single writer and group commit (`relay.sqlite`), PostgreSQL's pool, row locks, binary COPY and
LISTEN/NOTIFY (`relay.postgres`).

Every query names the account, so one account never reaches another's rows. Versions follow
`relay.versions`: pushes of one account are serialized, sequence numbers are consecutive and
become visible in order, and a version is dropped only when a stored version of its key
dominates it (docs/architecture.md §8.3, specs/protocol.md §5).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager

from relay.collection import check_horizon, check_run_bounds, page_end
from relay.dialect import Transaction
from relay.errors import (
    AccountExistsError,
    ForbiddenError,
    NotFoundError,
    QuotaExceededError,
)
from relay.signing import (
    Pusher,
    bundle_keys,
)
from relay.sqlcollect import (
    account_to_pull,
    collect,
    flag_if_runs,
    next_run,
    run_markers,
    standings_by_account,
    start_resync,
    summary,
)
from relay.sqlpush import PendingPush, authorized, push_plan, write_plan
from relay.storage import (
    AccountRecord,
    AccountSummary,
    CollectReport,
    CommitObserver,
    Device,
    HeadListener,
    LoginFailures,
    TokenKind,
    TokenRecord,
    VersionRules,
    new_random_id,
    refresh_step,
    spent_until,
)
from relay.versions import (
    check_envelope,
    cut_page,
    declared_tombstones,
    is_over_quota,
    page_bounds,
)
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
    decode_message,
    encode_message,
)

_INSERT_DEVICE = "INSERT INTO devices (account, id, name, created_ms) VALUES (?, ?, ?, ?)"
_INSERT_TOKEN = (
    "INSERT INTO tokens (hash, account, device, kind, expires_ms) VALUES (?, ?, ?, ?, ?)"
)
_INSERT_ACCOUNT = (
    "INSERT INTO accounts (name, auth_hash, recovery_hash, kdf, bundle, bundle_version,"
    " created_ms, epoch) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING RETURNING id"
)


def _insert_device(
    tx: Transaction, account_id: int, device: Device, tokens: list[TokenRecord]
) -> None:
    tx.run(_INSERT_DEVICE, (account_id, device.id, device.name, device.created_ms))
    _insert_tokens(tx, account_id, tokens)


def _insert_tokens(tx: Transaction, account_id: int, tokens: list[TokenRecord]) -> None:
    rows = [(t.hash, account_id, t.device_id, t.kind, t.expires_ms) for t in tokens]
    tx.run_many(_INSERT_TOKEN, rows)


class SQLStorage(ABC):
    """The `relay.storage.Storage` methods over a backend's transactions. A backend opens the
    database and gives `_write` (one durable write transaction), `_read` (a single-statement
    read) and `_snapshot` (several statements that see one state)."""

    def __init__(self, rules: VersionRules, new_id: Callable[[], str] = new_random_id) -> None:
        self._rules = rules
        self._new_id = new_id
        self._listeners: list[HeadListener] = []
        self._commit_observers: list[CommitObserver] = []
        self._storage_id = ""
        self._secret = b""

    @abstractmethod
    def _write(self) -> AbstractContextManager[Transaction]: ...

    @abstractmethod
    def _read(self) -> AbstractContextManager[Transaction]: ...

    @abstractmethod
    def _snapshot(self) -> AbstractContextManager[Transaction]: ...

    @abstractmethod
    def _is_missing_parent(self, exc: Exception) -> bool:
        """Whether `exc` is a foreign-key failure: a row for a device or account now gone."""

    @abstractmethod
    def close(self) -> None: ...

    @property
    def storage_id(self) -> str:
        return self._storage_id

    @property
    def secret(self) -> bytes:
        return self._secret

    # -- accounts ---------------------------------------------------------------------------

    def create_account(
        self,
        account: AccountRecord,
        device: Device,
        tokens: list[TokenRecord],
        invite_hash: bytes | None,
        now_ms: int,
    ) -> RelayState:
        epoch = self._new_id()
        with self._write() as tx:
            # the invite first (an existing name rolls its use back): without a usable invite,
            # a taken name and a free one look alike
            if invite_hash is not None and not tx.run(
                "DELETE FROM invites WHERE hash = ? AND expires_ms >= ?", (invite_hash, now_ms)
            ):
                raise ForbiddenError("the invite is unknown, used or expired")
            row = tx.one(_INSERT_ACCOUNT, (*_account_values(account), epoch))
            if row is None:
                raise AccountExistsError(f"account {account.name!r} already exists")
            _insert_device(tx, row[0], device, tokens)
        return RelayState(self._storage_id, epoch, 0)

    def account(self, name: str) -> AccountRecord | None:
        with self._read() as tx:
            row = tx.one(
                "SELECT name, auth_hash, recovery_hash, kdf, bundle, bundle_version, created_ms"
                " FROM accounts WHERE name = ?",
                (name,),
            )
        if row is None:
            return None
        kdf = decode_message(row[3], KdfParams)
        return AccountRecord(row[0], row[1], row[2], kdf, row[4], row[5], row[6])

    def delete_account(self, name: str) -> bool:
        with self._write() as tx:
            return tx.run("DELETE FROM accounts WHERE name = ?", (name,)) > 0

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
        new = (bundle, encode_message(kdf), auth_hash, recovery_hash)
        with self._write() as tx:
            changed = tx.run(
                "UPDATE accounts SET bundle = ?, kdf = ?, auth_hash = ?,"
                " recovery_hash = COALESCE(?, recovery_hash),"
                " bundle_version = bundle_version + 1 WHERE name = ? AND bundle_version = ?",
                (*new, name, expected_version),
            )
            if changed and revoke_device is not None:
                _revoke_in(tx, name, revoke_device)
            if changed and only_device is not None:
                # the other devices' rows first, as a refresh locks its device's: under
                # PostgreSQL's READ COMMITTED the DELETE then sees every successor a refresh
                # committed meanwhile, and a refresh after it finds its token gone
                tx.all(
                    "SELECT id FROM devices WHERE id != ?"
                    " AND account = (SELECT id FROM accounts WHERE name = ?) FOR NO KEY UPDATE",
                    (only_device, name),
                )
                tx.run(
                    "DELETE FROM tokens WHERE device != ?"
                    " AND account = (SELECT id FROM accounts WHERE name = ?)",
                    (only_device, name),
                )
        return expected_version + 1 if changed else None

    def add_invite(self, invite_hash: bytes, expires_ms: int) -> None:
        with self._write() as tx:
            tx.run("DELETE FROM invites WHERE expires_ms < ?", (self._rules.clock_ms(),))
            tx.run(
                "INSERT INTO invites (hash, expires_ms) VALUES (?, ?)", (invite_hash, expires_ms)
            )

    def accounts(
        self, name: str | None = None, *, horizon_ms: int | None = None
    ) -> list[AccountSummary]:
        check_horizon(horizon_ms)
        now_ms = self._rules.clock_ms()
        with self._snapshot() as tx:
            rows = tx.all(
                "SELECT a.id, a.name, a.created_ms,"
                " (SELECT count(*) FROM devices d WHERE d.account = a.id),"
                " (SELECT count(*) FROM versions v WHERE v.account = a.id),"
                " a.stored_bytes, a.head,"
                " (SELECT count(*) FROM versions v WHERE v.account = a.id AND v.tomb = 1),"
                " (SELECT CAST(coalesce(sum(length(v.envelope)), 0) AS BIGINT) FROM versions v"
                " WHERE v.account = a.id AND v.tomb = 1),"
                " a.collected_versions, a.collected_bytes,"
                " (SELECT count(*) FROM devices d WHERE d.account = a.id AND d.resync = 1)"
                " FROM accounts a"
                " WHERE CAST(? AS TEXT) IS NULL OR a.name = ? ORDER BY a.name",
                (name, name),
            )
            devices = standings_by_account(tx, name)
        return [summary(row, devices.get(row[0], []), now_ms, horizon_ms) for row in rows]

    def login_failures(self, name: str, address: str, since_ms: int) -> LoginFailures:
        with self._read() as tx:
            row = tx.one(
                "SELECT count(CASE WHEN address = ? THEN 1 END), count(*),"
                " min(CASE WHEN address = ? THEN at_ms END)"
                " FROM login_failures WHERE name = ? AND at_ms > ?",
                (address, address, name, since_ms),
            )
        from_address, from_anywhere, oldest = row or (0, 0, None)
        return LoginFailures(from_address, from_anywhere, oldest)

    def add_login_failure(self, name: str, address: str, at_ms: int, forget_before_ms: int) -> None:
        with self._write() as tx:
            tx.run("DELETE FROM login_failures WHERE at_ms <= ?", (forget_before_ms,))
            tx.run(
                "INSERT INTO login_failures (name, address, at_ms) VALUES (?, ?, ?)",
                (name, address, at_ms),
            )

    def clear_login_failures(self, name: str, address: str) -> None:
        with self._write() as tx:
            tx.run("DELETE FROM login_failures WHERE name = ? AND address = ?", (name, address))

    # -- devices and tokens -----------------------------------------------------------------

    def add_device(self, name: str, device: Device, tokens: list[TokenRecord]) -> None:
        try:
            with self._write() as tx:  # locked: a run committing meanwhile would miss it
                row = tx.one("SELECT id FROM accounts WHERE name = ? FOR NO KEY UPDATE", (name,))
                if row is None:
                    raise NotFoundError("no such account")
                _insert_device(tx, row[0], device, tokens)
                flag_if_runs(tx, row[0], device.id)
        except Exception as exc:  # the account was deleted meanwhile
            if not self._is_missing_parent(exc):
                raise
            raise NotFoundError("no such account or device") from exc

    def renew_device(self, name: str, device_id: str, tokens: list[TokenRecord]) -> bool:
        if not _can_name_a_device(device_id):
            return False
        with self._write() as tx:
            row = tx.one(
                "SELECT account FROM devices WHERE id = ?"
                " AND account = (SELECT id FROM accounts WHERE name = ?) FOR NO KEY UPDATE",
                (device_id, name),
            )
            if row is None:
                return False
            tx.run("DELETE FROM tokens WHERE account = ? AND device = ?", (row[0], device_id))
            _insert_tokens(tx, row[0], tokens)
        return True

    def devices(self, name: str) -> list[Device]:
        with self._read() as tx:
            rows = tx.all(
                "SELECT d.id, d.name, d.created_ms FROM devices d JOIN accounts a"
                " ON d.account = a.id WHERE a.name = ? ORDER BY d.id",
                (name,),
            )
        return [Device(*row) for row in rows]

    def rename_device(self, name: str, device_id: str, new_name: str) -> bool:
        if not _can_name_a_device(device_id):
            return False
        with self._write() as tx:
            changed = tx.run(
                "UPDATE devices SET name = ? WHERE id = ?"
                " AND account = (SELECT id FROM accounts WHERE name = ?)",
                (new_name, device_id, name),
            )
        return changed > 0

    def revoke_device(self, name: str, device_id: str, *, own: bool = False) -> bool:
        if not _can_name_a_device(device_id):
            return False
        with self._write() as tx:
            if not own:
                _remember_revoked_tokens(tx, name, device_id)
            return _deleted_device(tx, name, device_id)

    def is_revoked_token(self, token_hash: bytes) -> bool:
        with self._read() as tx:
            return tx.one("SELECT 1 FROM revoked_tokens WHERE hash = ?", (token_hash,)) is not None

    def token(self, token_hash: bytes) -> TokenRecord | None:
        with self._read() as tx:
            row = tx.one(
                "SELECT t.hash, a.name, t.device, t.kind, t.expires_ms FROM tokens t"
                " JOIN devices d ON d.account = t.account AND d.id = t.device"
                " JOIN accounts a ON t.account = a.id WHERE t.hash = ?",
                (token_hash,),
            )
        return TokenRecord(*row) if row else None

    def replace_token(
        self, old_hash: bytes, tokens: list[TokenRecord], grace_until_ms: int
    ) -> bool:
        try:
            with self._write() as tx:
                return self._replace_token(tx, old_hash, tokens, grace_until_ms)
        except Exception as exc:  # a successor for a device that is gone: nothing changed
            if not self._is_missing_parent(exc):
                raise
            return False

    def _replace_token(
        self, tx: Transaction, old_hash: bytes, tokens: list[TokenRecord], grace_until_ms: int
    ) -> bool:
        now = self._rules.clock_ms()
        found = _locked_token(tx, old_hash)
        if found is None:
            return False
        account, device, kind, expires_ms = found
        spent = tx.one(
            "SELECT max(expires_ms) FROM tokens WHERE account = ? AND device = ?"
            " AND kind = 'spent' AND hash != ?",
            (account, device, old_hash),
        )
        latest = spent[0] if spent else None  # an aggregate: always one row
        step = refresh_step(kind, expires_ms, latest, now)
        if step == "refuse":
            if kind == "spent":  # a used token used again, out of turn: a copy is loose
                tx.run("DELETE FROM tokens WHERE account = ? AND device = ?", (account, device))
            return False
        if step == "spend":
            tx.run(
                "UPDATE tokens SET kind = 'spent', expires_ms = ? WHERE hash = ?",
                (spent_until(grace_until_ms, latest), old_hash),
            )
        else:  # the reply was lost: the successors it carried were never received
            tx.run(
                "DELETE FROM tokens WHERE account = ? AND device = ? AND kind != 'spent'",
                (account, device),
            )
        _insert_tokens(tx, account, tokens)
        tx.run(  # the device's expired tokens go with each refresh
            "DELETE FROM tokens WHERE account = ? AND device = ? AND expires_ms <= ?",
            (account, device, now),
        )
        return True

    # -- versions ---------------------------------------------------------------------------

    def state(self, name: str) -> RelayState:
        with self._read() as tx:
            row = tx.one("SELECT epoch, head FROM accounts WHERE name = ?", (name,))
        if row is None:
            raise NotFoundError("no such account")
        return RelayState(self._storage_id, row[0], row[1])

    def reseed(self, name: str) -> RelayState:
        with self._write() as tx:
            row = tx.one(
                "UPDATE accounts SET epoch = ? WHERE name = ? RETURNING epoch, head",
                (self._new_id(), name),
            )
        if row is None:
            raise NotFoundError("no such account")
        return RelayState(self._storage_id, row[0], row[1])

    def stored_versions(self, name: str) -> int:
        with self._read() as tx:
            row = tx.one(
                "SELECT (SELECT count(*) FROM versions v WHERE v.account = a.id)"
                " FROM accounts a WHERE a.name = ?",
                (name,),
            )
        if row is None:
            raise NotFoundError("no such account")
        return int(row[0])

    def listen(self, listener: HeadListener) -> None:
        self._listeners.append(listener)

    def observe_commits(self, observer: CommitObserver) -> None:
        self._commit_observers.append(observer)

    def _committed(self, pushes: int) -> None:
        for observer in self._commit_observers:
            observer(pushes)

    def _tell_listeners(self, name: str, head: int) -> None:
        for listener in list(self._listeners):
            listener(name, head)

    def _check_batch(self, name: str, batch: PushBatch, pusher: Pusher | None) -> PendingPush:
        """Each envelope's header, or the refusal it earns before storage is read."""
        now_ms = self._rules.clock_ms()
        checked = [check_envelope(e, now_ms, self._rules.max_drift_ms) for e in batch.envelopes]
        tombs = declared_tombstones(batch)
        accept_unsigned = self._rules.accept_unsigned_pushes
        return PendingPush(name, batch, pusher, checked, tombs, accept_unsigned, now_ms)

    def _apply_push(self, tx: Transaction, push: PendingPush) -> tuple[PushResult, bool]:
        """One push inside a write transaction: its receipts, and whether the head moved.

        The account's row is locked first (`FOR NO KEY UPDATE`: pushes take turns, without
        blocking foreign-key checks of new devices or tokens); the push is authorized under
        it. The stored versions of the batch's keys are read at once (one query on PostgreSQL,
        chunks on SQLite), the batch decided in memory (`PushPlan`), and what stays written
        with one statement per table. A push over quota, or of a device that must resync,
        is refused once its counter is recorded: the caller commits, then raises."""
        row = tx.one(
            "SELECT id, epoch, head, stored_bytes, bundle FROM accounts WHERE name = ?"
            " FOR NO KEY UPDATE",
            (push.name,),
        )
        if row is None:
            raise NotFoundError("no such account")
        account_id, epoch, before, stored_bytes, bundle = row
        state, account_keys = RelayState(self._storage_id, epoch, before), bundle_keys(bundle)
        checked, tombs = authorized(tx, account_id, account_keys, state, push)
        if push.refusal is not None:  # a device that must resync first
            return PushResult([], state), False
        keys = [header.key for header in checked if isinstance(header, Header)]
        plan = push_plan(tx, account_id, before, stored_bytes, keys, account_keys)
        receipts = [
            h if isinstance(h, Receipt) else plan.add(h, e, tomb)
            for h, e, tomb in zip(checked, push.batch.envelopes, tombs, strict=True)
        ]
        if is_over_quota(plan.stored_bytes, stored_bytes, self._rules.max_account_bytes):
            push.refusal = QuotaExceededError(
                f"the batch would take the account past its quota of "
                f"{self._rules.max_account_bytes} bytes"
            )
            return PushResult([], state), False
        if plan.head != before or plan.declared:
            write_plan(tx, account_id, plan)
        if plan.head != before:
            tx.announce(push.name, plan.head)
        state = RelayState(self._storage_id, epoch, plan.head)
        return PushResult(receipts, state), plan.head != before

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
        if device_id is not None and resync and cursor == 0:
            self._start_resync(name, device_id)
        with self._snapshot() as tx:
            account_id, epoch, head, last_run = account_to_pull(tx, name, device_id, resync)
            run = next_run(tx, account_id, cursor)
            until = head if run is None else run - 1  # a page ends at a run
            sizes = tx.all(
                "SELECT seq, length(envelope) FROM versions WHERE account = ? AND seq > ?"
                " AND seq <= ? ORDER BY seq LIMIT ?",
                (account_id, cursor, until, count + 1),
            )
            kept, has_more = cut_page(sizes, count, self._rules.max_page_bytes)
            rows = tx.all(
                "SELECT seq, envelope FROM versions WHERE account = ? AND seq > ? AND seq <= ?"
                " ORDER BY seq",
                (account_id, cursor, sizes[kept - 1][0] if kept else cursor),
            )
            collected = None
            if run is not None and not has_more:  # the page reached the run: its markers
                collected = run_markers(tx, account_id, run)
        entries = [PageEntry(seq, envelope) for seq, envelope in rows]
        next_cursor, has_more = page_end(entries, has_more, run, head, cursor)
        state = RelayState(self._storage_id, epoch, head)
        return Page(cursor, entries, next_cursor, has_more, state, collected, last_run)

    def _start_resync(self, name: str, device_id: str) -> None:
        with self._write() as tx:
            start_resync(tx, name, device_id, self._rules.clock_ms())

    def collect(
        self, name: str, *, limit: int = MAX_RUN_MARKERS, horizon_ms: int | None = None
    ) -> CollectReport:
        check_run_bounds(limit, horizon_ms)
        with self._write() as tx:
            report = collect(tx, name, self._rules.clock_ms(), limit, horizon_ms)
        if report.run is not None:
            self._tell_listeners(name, report.run)
        return report


def _account_values(account: AccountRecord) -> tuple[object, ...]:
    return (
        account.name,
        account.auth_hash,
        account.recovery_hash,
        encode_message(account.kdf),
        account.bundle,
        account.bundle_version,
        account.created_ms,
    )


def _deleted_device(tx: Transaction, name: str, device_id: str) -> bool:
    """The tokens go by ON DELETE CASCADE, not by a DELETE of our own: under PostgreSQL's
    READ COMMITTED that would miss the successors of a refresh committing meanwhile, while
    the device row is locked (FOR KEY SHARE) by every token insert until it commits."""
    deleted = tx.run(
        "DELETE FROM devices WHERE id = ? AND account = (SELECT id FROM accounts WHERE name = ?)",
        (device_id, name),
    )
    return deleted > 0


def _remember_revoked_tokens(tx: Transaction, name: str, device_id: str) -> None:
    """Keep the hashes of a device's tokens as it is revoked (`is_revoked_token`). A successor
    that a refresh commits meanwhile is missed: its holder hears only that its session ended."""
    tx.run(
        "INSERT INTO revoked_tokens (hash, account) SELECT hash, account FROM tokens"
        " WHERE device = ? AND account = (SELECT id FROM accounts WHERE name = ?)"
        " ON CONFLICT (hash) DO NOTHING",
        (device_id, name),
    )


def _revoke_in(tx: Transaction, name: str, device_id: str) -> None:
    """Revoke inside a bundle change: no such device undoes the whole transaction."""
    if not _can_name_a_device(device_id):
        raise NotFoundError("no such device")
    _remember_revoked_tokens(tx, name, device_id)
    if not _deleted_device(tx, name, device_id):
        raise NotFoundError("no such device")


def _can_name_a_device(device_id: str) -> bool:
    """No device id holds a NUL: PostgreSQL TEXT cannot even store one, so it is not asked."""
    return "\0" not in device_id


def _locked_token(tx: Transaction, old_hash: bytes) -> tuple[int, str, TokenKind, int] | None:
    """(account, device, kind, expires_ms) of a token whose device row this transaction now
    holds. Refreshes of one device take turns on that row, and so does `revoke_device`'s
    DELETE: under PostgreSQL's READ COMMITTED a lock on the token row alone would let a replay
    and a refresh miss each other's successors (two live chains), and lock the device and its
    tokens in the opposite order to a revoke (a deadlock). SQLite's one writer needs no lock."""
    found = tx.one("SELECT account, device FROM tokens WHERE hash = ?", (old_hash,))
    if found is None:
        return None
    account, device = found
    if not tx.one(
        "SELECT 1 FROM devices WHERE account = ? AND id = ? FOR NO KEY UPDATE", (account, device)
    ):
        return None
    row = tx.one("SELECT kind, expires_ms FROM tokens WHERE hash = ?", (old_hash,))
    if row is None:
        return None
    return account, device, row[0], row[1]
