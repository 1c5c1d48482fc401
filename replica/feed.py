"""The local change feed: which records changed since a cursor, across processes and restarts.

A change is one record whose visible state changed here: written, merged (pulled or released
from hold), or repaired. It takes a sequence number from the counter in meta `feed_seq`,
inside the write transaction that makes it, so numbers follow commit order and none is
given twice; every row of the record carries its latest one (`versions.changed`,
`local.changed`), so the feed keeps one entry per record and grows with nothing but the
records. `changes(since)` lists the records whose latest change is after `since`, oldest
first, each once. A follower that stores the returned cursor in the same transaction as its
effects sees every change exactly once (a record that changed twice meanwhile, once, in its
latest state); one that stores it later sees some again.

A cursor names the feed it came from (`feed_id`, drawn anew when the file becomes another
device's copy, `Store.set_node`, and when a repair removes a record whose absence the feed
cannot show) and a sequence number. A cursor of another feed raises `FeedResetError`: read
everything again, from `feed_head()` on.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from watchfiles import watch

from replica.core import Core
from replica.envelope import Identity
from replica.errors import EnvelopeError, FeedResetError, InvalidArgumentError, UnknownEpochError
from replica.write import local_row

MAX_PAGE = 10_000
_CURSOR = re.compile(r"([0-9a-f]{32})\.([0-9]{1,19})")


@dataclass(frozen=True)
class Change:
    """One record that changed: its opaque key, and its names when this handle can open it
    (None while locked, or when the record does not open: a read then says why)."""

    seq: int
    key: bytes
    identity: Identity | None


@dataclass(frozen=True)
class ChangePage:
    """Changes after a cursor, oldest first; `cursor` follows the last (pass it as `since`),
    and `more` says another page is there already."""

    changes: list[Change]
    cursor: str
    more: bool


def _format(feed_id: str, seq: int) -> str:
    return f"{feed_id}.{seq}"


def _parse(cursor: str) -> tuple[str, int]:
    match = _CURSOR.fullmatch(cursor) if isinstance(cursor, str) else None
    if match is None:
        raise InvalidArgumentError(
            f"not a change feed cursor: {cursor!r}", hint="pass ChangePage.cursor or feed_head()"
        )
    return match[1], int(match[2])


def head(core: Core) -> str:
    """The cursor after the latest change: follow from here after reading everything."""
    store = core.store
    return _format(str(store.get_meta("feed_id")), store.get_int("feed_seq"))


def _start(core: Core, since: str | None) -> int:
    """The sequence number `since` names, checked against this file's feed."""
    if since is None:
        return 0
    feed_id, seq = _parse(since)
    store = core.store
    current = str(store.get_meta("feed_id"))
    if feed_id != current:
        raise FeedResetError(
            f"this cursor is another feed's ({feed_id}; this file's is {current}): the file "
            "is a copy or a restored backup, or a repair removed records",
            hint="read everything again, then follow from feed_head()",
        )
    if seq < store.get_int("feed_floor"):
        raise FeedResetError(
            f"this cursor's change {seq} is older than a tombstone the relay collected since "
            "(docs/tombstone-collection.md): the feed cannot show that it is gone",
            hint="read everything again, then follow from feed_head()",
        )
    head = store.get_int("feed_seq")
    if seq > head:
        raise FeedResetError(
            f"this cursor's change {seq} is past the feed's last, {head}: the file went back "
            "(a restored copy)",
            hint="read everything again, then follow from feed_head()",
        )
    return seq


def changes(core: Core, since: str | None, limit: int) -> ChangePage:
    """The records whose latest change is after `since` (None: every record the feed
    holds), at most `limit` of them, read in one snapshot of the file."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidArgumentError(f"limit {limit} outside 1..{MAX_PAGE}")
    store = core.store
    with store.snapshot():
        seq = _start(core, since)
        rows = store.changes_after(seq, limit + 1)
        feed_id, last = str(store.get_meta("feed_id")), store.get_int("feed_seq")
        found: list[Change] = []
        for changed, key, table in rows[:limit]:
            if found and found[-1].seq == changed:
                continue  # another sibling of the same record
            found.append(Change(changed, key, _identity(core, key, table)))
    more = len(rows) > limit
    end = found[-1].seq if more else last
    return ChangePage(found, _format(feed_id, end), more)


def _identity(core: Core, key: bytes, table: str) -> Identity | None:
    """The names of the record `key`, from one of its rows, if this handle can open it."""
    opener = core.opener
    if opener is None:
        return None
    rows = core.store.versions_of(key) if table == "versions" else []
    if table == "local":
        envelope = core.store.get_local(key)
        rows = [] if envelope is None else [local_row(key, envelope)]
    try:
        return opener.open_row(rows[0]).identity if rows else None
    except UnknownEpochError:
        core.refuse_stale_keys()  # newer keys elsewhere: unlock again, skip nothing
        return None
    except EnvelopeError:
        return None


def wait(core: Core, path: Path, since: str, timeout_s: float) -> bool:
    """Whether a change after `since` committed within `timeout_s` seconds: woken by the
    replica's files changing (watchfiles), and checked at least once a second besides, in
    case an event is lost (or the platform has no file events: then it polls)."""
    _, seq = _parse(since)
    deadline = time.monotonic() + timeout_s

    def newer() -> bool:
        with core.mutex:
            core.check_open()
            return core.store.get_int("feed_seq") > seq

    if newer():
        return True
    try:
        return _watch(path, deadline, newer)
    except (OSError, RuntimeError):  # no file events here (inotify limits, platforms)
        while time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            if newer():
                return True
        return False


def _watch(path: Path, deadline: float, newer: Callable[[], bool]) -> bool:
    stop = threading.Event()
    timer = threading.Timer(max(0.0, deadline - time.monotonic()), stop.set)
    timer.start()
    try:
        for _ in watch(
            path.parent,
            watch_filter=lambda _, changed: Path(changed).name.startswith(path.name),
            stop_event=stop,
            rust_timeout=1000,
            yield_on_timeout=True,
            raise_interrupt=False,
        ):
            if newer():
                return True
    finally:
        timer.cancel()
    return newer()
