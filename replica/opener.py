"""Opening stored rows through a bounded cache of decrypted versions.

A row is trusted only when its envelope opens and names the same (key, node, hlc) as the row
itself, so an envelope copied into another record's row is caught here, not shown.
"""

from __future__ import annotations

from collections import OrderedDict

from replica.asides import Row
from replica.envelope import Opened, open_envelope
from replica.errors import EnvelopeError
from replica.keys import AccountKeys
from replica.wire import Header


class Opener:
    """Decrypts envelopes for one unlocked account, remembering the last `max_entries`."""

    def __init__(self, keys: AccountKeys, max_entries: int) -> None:
        self.keys = keys
        self._max_entries = max_entries
        self._cache: OrderedDict[bytes, Opened] = OrderedDict()

    def open(self, envelope: bytes, header: Header | None = None) -> Opened:
        """Open an envelope, or raise `EnvelopeError` / `UnknownEpochError`. Merges call
        `open_envelope` directly: a page of new versions would only churn the cache of reads
        (and hashing each one to look it up costs more than the rare hit saves)."""
        opened = self._cache.get(envelope)
        if opened is not None:
            self._cache.move_to_end(envelope)
            return opened
        opened = open_envelope(self.keys, envelope, header)
        self._cache[envelope] = opened
        if len(self._cache) > self._max_entries:
            self._cache.popitem(last=False)
        return opened

    def open_row(self, row: Row) -> Opened:
        opened = self.open(row.envelope)
        header = opened.header
        if (header.key, header.node, header.hlc) != (row.key, row.node, row.hlc):
            raise EnvelopeError("a stored envelope does not belong to the row that holds it")
        return opened

    def forget(self) -> None:
        self._cache.clear()
