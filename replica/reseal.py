"""Re-sealing this device's pending writes after a rotation retired their key epoch
(docs/key-generations.md §6).

Every device refuses a version sealed under a retired epoch that the rotation's frontier does
not vouch for: a revoked device keeps the old keys. A write this device made offline, before
it took the new generation, is such a version; so it is sealed again under the newest epoch,
with the same dot and vector, before it is pushed. Its earlier sealing never reached the
relay: the rotating device pulled all the relay held (the relay checked its head), so a
version stored there before is within the frontier and is not re-sealed, and after the
rotation the relay refuses the old signing key. No other copy of that dot exists.
"""

from __future__ import annotations

from replica.envelope import open_envelope, seal
from replica.errors import EnvelopeError, ProtocolError, UnknownEpochError
from replica.keys import AccountKeys, RandomBytes
from replica.store import Store
from replica.wire import NONCE_BYTES, Header, parse_header


def pending_beyond_frontier(store: Store, keys: AccountKeys) -> list[tuple[int, Header, bytes]]:
    """(row id, header, envelope) of each dirty version sealed under a retired epoch whose
    frontier does not vouch for it (read only: the usual unlock finds none). A row whose
    header does not parse is left out: the push path keeps damaged rows back."""
    retired = keys.retired_epochs
    found = []
    for rowid, envelope in store.db.execute("SELECT id, envelope FROM versions WHERE dirty = 1"):
        try:
            header = parse_header(envelope)
        except ProtocolError:
            continue
        frontier = retired.get(header.epoch)
        if frontier is not None and not frontier.trusts(header.vector, None, None):
            found.append((rowid, header, envelope))
    return found


def reseal_pending(store: Store, keys: AccountKeys, random_bytes: RandomBytes) -> int:
    """Re-seal, inside the caller's write transaction, every version `pending_beyond_frontier`
    finds; how many. One that no longer opens is left as it is."""
    updates: list[tuple[bytes, int]] = []
    for rowid, header, envelope in pending_beyond_frontier(store, keys):
        try:
            opened = open_envelope(keys, envelope, header)
        except (EnvelopeError, UnknownEpochError):
            continue
        fresh = seal(
            keys,
            opened.identity,
            hlc=header.hlc,
            node=header.node,
            vector=header.vector,
            deleted=opened.deleted,
            document=opened.document,
            nonce=random_bytes(NONCE_BYTES),
        )
        updates.append((fresh, rowid))
    store.db.executemany("UPDATE versions SET envelope = ? WHERE id = ?", updates)
    return len(updates)
