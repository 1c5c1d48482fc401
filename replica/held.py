"""Explicit freshness locks and the versions held back: take them, end them, accept them.

Versions are held, never dropped, for three reasons besides drift and locks: `sealed` (pulled
while the replica was locked), `epoch` (an unknown key epoch), `collection` (undeclared, or
device-local, in this replica's schema). Each is merged again when its reason goes away —
see `Core.recheck_held`.
"""

from __future__ import annotations

from replica.core import Core
from replica.envelope import profile_key
from replica.errors import InvalidArgumentError
from replica.limits import check_name


def lock_scope(
    core: Core, profile: str, collection: str | None, id: str | None, duration_s: float | None
) -> int:
    """Store an explicit lock on a profile, a collection in it, or one record."""
    max_lock_s = core.options.max_lock_s
    duration_s = max_lock_s if duration_s is None else duration_s
    if not isinstance(duration_s, (int, float)) or not 0 < duration_s <= max_lock_s:
        raise InvalidArgumentError(f"lock duration {duration_s} s outside (0, {max_lock_s}]")
    keys = core.keys()
    check_name("profile", profile)
    if id is not None:
        if collection is None:
            raise InvalidArgumentError("a record lock needs its collection")
        _, identity = core.resolve(collection, id, profile)
        kind, target = "record", keys.record_key(identity.profile, identity.collection, identity.id)
    elif collection is not None:
        core.schema.require(check_name("collection", collection))
        kind, target = "collection", core.scope(profile, collection)
    else:
        kind, target = "profile", profile_key(keys, profile)
    with core.write_transaction():
        expires = core.options.wall_clock_ms() + int(duration_s * 1000)
        return core.store.add_lock(kind, target, expires)


def release_lock(core: Core, lock_id: int) -> None:
    with core.write_transaction():
        if not core.store.delete_lock(lock_id):
            raise InvalidArgumentError(f"no lock with id {lock_id} (it may have expired)")
    core.recheck_held(("lock",))


def accept_held(core: Core) -> int:
    """Merge every version held for drift now; the clock observes them."""
    core.keys()
    with core.write_transaction():
        rows = core.store.held_rows(("drift",))
        core.merge_held(rows, None, accept_drift=True)
    return len(rows)
