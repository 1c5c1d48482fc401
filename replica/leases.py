"""Leases: one holder at a time for a named piece of work, across threads and processes.

A lease is a row of the device-local table `leases` (name, owner, expiry), taken and given
back in write transactions, so every process on the replica file sees it. The name is the
HMAC of the app's name under the scope key: the file does not show what is leased (a chat's
id, say). A holder's lease is renewed by a background thread every third of its time to
live; a crashed holder's lease runs out, and the next taker removes it. Whoever took a lease
checks, inside the transaction that commits its work, that it still holds it (`check`): if
it ran out and another took it, the work is refused rather than interleaved (a fencing
check). Slow work runs under the lease but outside any transaction, so other leases, and
other writers, go on meanwhile.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

from replica.core import Core
from replica.errors import InvalidArgumentError, LeaseBusyError, SealsyncError
from replica.keys import length_prefixed

MAX_TTL_S = 3600.0
MAX_WAIT_S = 600.0
_POLL_S = (0.005, 0.1)
"""Waiting for a busy lease polls, from 5 ms doubling up to 100 ms."""


class Lease:
    """A taken lease; a context manager that gives it back. See `Replica.lease`."""

    def __init__(self, core: Core, name: str, ttl_s: float) -> None:
        self.name = name
        self._core = core
        self._ttl_ms = int(ttl_s * 1000)
        self._key = lease_key(core, name)
        self._owner = core.options.random_bytes(16)
        self._stop = threading.Event()
        self.lost = False
        """Set when a renewal or `check` found the lease ran out (another may hold it)."""

    def __repr__(self) -> str:
        state = "lost" if self.lost else "released" if self._stop.is_set() else "held"
        return f"Lease({self.name!r}, {state})"

    def _take(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        pause = _POLL_S[0]
        while True:
            expires_ms = self._try_take()
            if expires_ms is None:
                break
            if time.monotonic() + pause > deadline:
                left_s = max(0, expires_ms - self._core.options.wall_clock_ms()) / 1000
                raise LeaseBusyError(
                    f"lease {self.name!r} is held by another, for up to {left_s:.1f} s more",
                    hint="try again later; a crashed holder's lease runs out",
                )
            time.sleep(pause)
            pause = min(pause * 2, _POLL_S[1])
        threading.Thread(target=self._renew_until_released, daemon=True).start()

    def _try_take(self) -> int | None:
        """Take the lease if no one else holds it; else when the holder's runs out."""
        core = self._core
        with core.mutex, core.write_transaction():
            now = core.options.wall_clock_ms()
            holder = core.store.take_lease(self._key, self._owner, now, now + self._ttl_ms)
        return holder

    def _renew_until_released(self) -> None:
        while not self._stop.wait(self._ttl_ms / 3000):
            if not self._renew():
                self.lost = True
                return

    def _renew(self) -> bool:
        core = self._core
        with core.mutex:
            if self._stop.is_set():
                return True  # released meanwhile: nothing to renew
            if core.is_closed():
                return False
            try:
                with core.write_transaction():
                    now = core.options.wall_clock_ms()
                    return core.store.renew_lease(self._key, self._owner, now, now + self._ttl_ms)
            except SealsyncError:  # the file failed under it: count the lease lost
                return False

    def check(self) -> None:
        """Raise `LeaseBusyError` unless this lease is still held (call it inside the
        transaction that commits the work it guards)."""
        core = self._core
        with core.mutex:
            core.check_open()  # closed (or its file could not be opened again): not held
            now = core.options.wall_clock_ms()
            if self.lost or not core.store.holds_lease(self._key, self._owner, now):
                self.lost = True
                raise LeaseBusyError(
                    f"lease {self.name!r} ran out and was taken by another",
                    hint="the work it guarded was not committed; start it again",
                )

    def release(self) -> None:
        """Give the lease back (nothing happens if it ran out and another took it)."""
        if self._stop.is_set():
            return
        self._stop.set()  # the renewer sees it under the mutex, and renews no more
        core = self._core
        with core.mutex:
            if not core.is_closed():
                with core.write_transaction():
                    core.store.drop_lease(self._key, self._owner)

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()


def take(core: Core, name: str, ttl_s: float, wait_s: float) -> Lease:
    """Take the lease `name` for `ttl_s` seconds (renewed while held), waiting up to
    `wait_s` seconds for another holder to give it back or run out."""
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError("a lease needs a non-empty name")
    if not 0.1 <= ttl_s <= MAX_TTL_S:
        raise InvalidArgumentError(f"lease ttl_s {ttl_s} outside 0.1..{MAX_TTL_S}")
    if not 0 <= wait_s <= MAX_WAIT_S:
        raise InvalidArgumentError(f"lease wait_s {wait_s} outside 0..{MAX_WAIT_S}")
    lease = Lease(core, name, ttl_s)
    lease._take(wait_s)
    return lease


def is_free(core: Core, name: str) -> bool:
    """Whether no one holds the lease `name` now (read inside the caller's transaction, it
    stays true until that transaction ends: taking a lease is a write)."""
    return not core.store.lease_held(lease_key(core, name), core.options.wall_clock_ms())


def lease_key(core: Core, name: str) -> bytes:
    """The lease's name in the file: an HMAC (the app's names are its own)."""
    return core.derived(
        ("lease", name), lambda: core.keys().local_key(b"lease" + length_prefixed(name))
    )
