"""What the relay is told of tombstones: which envelopes of a push are tombstones (the push's
tombstone bits), and what a page says the relay collected (specs/protocol.md §4.8): a run's
markers.

A collection run deletes stored tombstones that every device has acknowledged, and takes a
seq of its own, so a device meets it once, in order, like a version. Its markers name each
deleted version by its dot and key, packed as `MARKER` rows: 16-byte key, u64 node, u64 hlc.
The relay sends no vector and no envelope: a device drops only the tombstone it holds with
that exact dot, one it opened itself (docs/tombstone-collection.md §4).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
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


def tombstone_bits(flags: Sequence[bool]) -> bytes:
    """`PushBatch.tombstones`: bit i (byte i // 8, from its lowest bit) set when envelope i is
    a tombstone, as few bytes as the last set bit needs (none when no bit is set)."""
    bits = sum(1 << i for i, flag in enumerate(flags) if flag)
    return bits.to_bytes((bits.bit_length() + 7) // 8, "little")


def tombstone_flags(count: int, tombstones: bytes) -> list[bool]:
    """Each of `count` envelopes' bit of `tombstones`; `ProtocolError` for bits past the last."""
    bits = int.from_bytes(tombstones, "little")
    if bits >> count or len(tombstones) > (count + 7) // 8:
        raise ProtocolError(f"tombstones holds bits past the {count} envelopes sent")
    return [bool(bits >> i & 1) for i in range(count)]
