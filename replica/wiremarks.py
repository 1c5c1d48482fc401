"""What a page says the relay collected (specs/protocol.md §4.8): a run's markers.

A collection run deletes stored tombstones that every device has acknowledged, and takes a
seq of its own, so a device meets it once, in order, like a version. Its markers name each
deleted version by its dot and key, packed as `MARKER` rows: 16-byte key, u64 node, u64 hlc.
The relay sends no vector and no envelope: a device drops only the tombstone it holds with
that exact dot, one it opened itself (docs/tombstone-collection.md §4).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Annotated

import msgspec

from replica.errors import ProtocolError

MARKER = struct.Struct(">16sQQ")
MAX_RUN_MARKERS = 10_000
"""At most this many tombstones per run: a page carrying one stays within 320 KB."""

MarkedDot = tuple[bytes, int, int]
"""(key, node, hlc) of a collected version."""


class CollectedRun(msgspec.Struct, frozen=True):
    """One run: the seq it took, and the packed markers of the versions it deleted."""

    seq: Annotated[int, msgspec.Meta(ge=1, le=(1 << 63) - 1)]
    markers: Annotated[bytes, msgspec.Meta(max_length=MAX_RUN_MARKERS * MARKER.size)]


def pack_markers(dots: Iterable[MarkedDot]) -> bytes:
    return b"".join(MARKER.pack(key, node, hlc) for key, node, hlc in dots)


def unpack_markers(run: CollectedRun) -> list[MarkedDot]:
    """The run's dots; `ProtocolError` for bytes that are not whole markers."""
    if len(run.markers) % MARKER.size:
        raise ProtocolError(
            f"run {run.seq}: {len(run.markers)} bytes of markers, not a multiple of {MARKER.size}"
        )
    return list(MARKER.iter_unpack(run.markers))
