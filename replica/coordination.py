"""The methods of a `Replica` that coordinate it with other writers: freshness locks and
held versions (specs/merge.md §10, §11), leases (specs/replica.md §13.1), journals (§13.2),
the change feed (§11.1) and in-process subscriptions (§11).

A mixin of `Replica` (replica/replica.py), which owns the `Core` these work through.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from replica import feed, held, journal, leases
from replica.asides import ChangeMark
from replica.collected import collected_counts
from replica.core import Core
from replica.errors import DegradedError, InvalidArgumentError
from replica.events import Subscriber
from replica.feed import ChangePage
from replica.journal import DeferredWrite, JournalEntry
from replica.leases import Lease
from replica.schema import DEFAULT_PROFILE


class Coordination:
    """Locks, holds, leases, journals, the change feed and subscriptions of a `Replica`."""

    _core: Core

    # -- freshness locks and held versions ------------------------------------------------------

    def lock_scope(
        self,
        *,
        profile: str = DEFAULT_PROFILE,
        collection: str | None = None,
        id: str | None = None,
        duration_s: float | None = None,
    ) -> int:
        """Hold every inbound version of a profile, a collection in it, or one record until
        `release_lock` or the duration ends (at most `max_lock_s`); returns the lock's id."""
        with self._core.mutex:
            return held.lock_scope(self._core, profile, collection, id, duration_s)

    def release_lock(self, lock_id: int) -> None:
        """End an explicit lock now; the versions it held merge as if they had just arrived."""
        with self._core.mutex:
            held.release_lock(self._core, lock_id)

    def accept_held(self) -> int:
        """Merge the versions held for drift now (the user trusts the sender's clock)."""
        with self._core.mutex:
            return held.accept_held(self._core)

    def held_counts(self) -> dict[str, int]:
        """Versions held, by reason (drift, lock, sealed, epoch, collection): cheap, unlike
        `status()`. An app that reasons about what merged so far waits while some are held."""
        with self._core.mutex:
            self._core.check_open()
            return self._core.store.count_held()

    def saw_collection(self) -> bool:
        """Whether this file ever dropped what its relay collected (a run's markers, or a
        full resync): cheap, unlike `status()`. From then on a record absent here may be one
        deleted and collected everywhere, not only one still on its way (replica.md §2)."""
        with self._core.mutex:
            self._core.check_open()
            store = self._core.store
            return collected_counts(store)[0] > 0 or store.get_int("resync_dropped") > 0

    def release_due(self) -> None:
        """Merge held versions whose lock ended or whose time came, now (reads and writes do
        this once per transaction)."""
        with self._core.mutex:
            self._core.release_due(every_time=True)

    def version_stamp(
        self, collection: str, id: str, *, profile: str = DEFAULT_PROFILE
    ) -> tuple[tuple[int, int, bytes], ...]:
        """What names the record's versions now, each (node, hlc, AEAD tag), read without
        opening one (empty: none): while the stamp stays the same, so does the record, and an
        app may keep what it read and checked of it instead of reading it again. Raises
        `DegradedError` as `get` does once the record is latched degraded. Synced collections
        only (a device-local record has no versions)."""
        core = self._core
        with core.mutex:
            spec, identity = core.resolve(collection, id, profile)
            if spec.policy == "local":
                raise InvalidArgumentError(f"{collection} is device-local: it has no versions")
            core.release_due()
            stamp, degraded = core.store.version_ids(core.record_key(identity))
            if degraded:
                raise DegradedError(
                    f"record {collection}/{id} is degraded: one of its versions cannot be opened",
                    hint="run repair to quarantine the unreadable versions",
                )
            return stamp

    def change_mark(self) -> ChangeMark:
        """Inside `batch()`, once held versions that fell due have merged: a value that stays
        the same exactly while nothing changes the file. An app that checked something in one
        transaction, and finds the same mark at the start of the next, need not read it again
        (the chat store appends so)."""
        core = self._core
        with core.mutex:
            core.check_open()
            if not core.store.in_transaction:
                raise InvalidArgumentError("change_mark is read inside batch()")
            core.release_due()
            return core.store.change_mark()

    def lease(self, name: str, *, ttl_s: float = 30.0, wait_s: float = 0.0) -> Lease:
        """Take the lease `name`: one holder at a time across threads and processes on this
        file, renewed while held, given back on exit (a context manager); a crashed holder's
        runs out after `ttl_s`. Waits up to `wait_s` for another holder, then raises
        `LeaseBusyError`. Check `lease.check()` inside the transaction that commits the work
        it guards (replica/leases.py)."""
        with self._core.mutex:
            self._core.opener_or_raise()
        return leases.take(self._core, name, ttl_s, wait_s)

    def lease_is_free(self, name: str) -> bool:
        """Whether no one holds the lease `name`: inside `batch()`, true until it ends (a
        one-transaction operation that must not interleave with a lease's holder)."""
        with self._core.mutex:
            return leases.is_free(self._core, name)

    # -- journals ----------------------------------------------------------------------------------

    def journal_push(
        self,
        collection: str,
        name: str,
        document: Any,
        *,
        keep: int,
        profile: str = DEFAULT_PROFILE,
    ) -> int:
        """Add `document` as the newest entry of the journal `name` of a `local` collection,
        dropping its entries older than the newest `keep`; the entry's sequence number."""
        with self._core.mutex:
            return journal.push(self._core, profile, collection, name, document, keep)

    def journal_pop(
        self, collection: str, name: str, *, profile: str = DEFAULT_PROFILE
    ) -> JournalEntry | None:
        """Take the journal's newest entry off it (None when it is empty)."""
        with self._core.mutex:
            return journal.pop(self._core, profile, collection, name)

    def journal_deferred(
        self, collection: str, name: str, *, keep: int, profile: str = DEFAULT_PROFILE
    ) -> list[DeferredWrite]:
        """The writes whose entry in the journal `name` was deferred (`put(...,
        deferred_entry=)`), oldest first, each handed over once: the newest `keep`. The
        caller pushes their entries in the same transaction."""
        with self._core.mutex:
            return journal.deferred(self._core, profile, collection, name, keep)

    def journal_count(self, collection: str, name: str, *, profile: str = DEFAULT_PROFILE) -> int:
        with self._core.mutex:
            return journal.count(self._core, profile, collection, name)

    # -- the change feed and subscriptions ---------------------------------------------------------

    def changes(self, since: str | None = None, *, limit: int = 1000) -> ChangePage:
        """The records that changed after the cursor `since` (None: all the feed holds), in
        commit order, each once; across processes and restarts (replica/feed.py). Raises
        `FeedResetError` for a cursor this file's feed cannot continue."""
        with self._core.mutex:
            self._core.check_open()
            return feed.changes(self._core, since, limit)

    def feed_head(self) -> str:
        """The cursor after the latest change (take it before reading everything)."""
        with self._core.mutex:
            self._core.check_open()
            return feed.head(self._core)

    def wait_for_change(self, since: str, timeout_s: float) -> bool:
        """Block until a change after `since` commits, in any process (False on timeout)."""
        return feed.wait(self._core, self._core.store.path, since, timeout_s)

    def on_lock(self, method: Callable[[], None]) -> None:
        """Call `method` (a bound method, held weakly) whenever this handle drops its keys
        (`lock`, `close`, a new unlock): an app that keeps decrypted data drops it then."""
        with self._core.mutex:
            self._core.lock_listeners.append(weakref.WeakMethod(method))

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call `callback` with each ChangeEvent after its transaction commits; returns unsubscribe."""
        return self._core.subscribers.add(callback)
