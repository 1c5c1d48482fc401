"""The memory relay's collection runs (`relay.collection`): what `relay.sqlcollect` keeps in
the `collect_runs` and `collected` tables, held per account."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from relay.collection import Standing
from relay.errors import ResyncRequiredError
from relay.storage import Device
from relay.versions import StoredVersion
from replica.wire import (
    CollectedRun,
    Header,
    VersionVector,
    node_to_i64,
    pack_markers,
    parse_header,
)

Acks = dict[str, tuple[int, int]]
"""device id → (the cursor it last acknowledged, when)."""


@dataclass
class Runs:
    """One account's retained runs, and what its runs collected to date."""

    headers: dict[int, list[Header]] = field(default_factory=dict)
    """run seq → the headers of the tombstones it deleted."""
    seqs: list[int] = field(default_factory=list)
    """The retained runs' seqs, ascending."""
    ghosts: dict[bytes, list[tuple[int, VersionVector]]] = field(default_factory=dict)
    """key → (run seq, vector) of its collected tombstones that retained runs keep."""
    collected_versions: int = 0
    collected_bytes: int = 0
    last_run_seq: int = 0
    resync: dict[str, int | None] = field(default_factory=dict)
    """device id → when its full resync began (None: not yet), for each flagged device."""

    def add(
        self,
        run: int,
        taken: list[int],
        by_seq: dict[int, bytes],
        by_key: dict[bytes, list[StoredVersion]],
        tombs: set[int],
    ) -> int:
        """Delete the versions `taken` (their seqs) as run `run`; their bytes."""
        headers = [parse_header(by_seq[seq]) for seq in taken]
        size = sum(len(by_seq.pop(seq)) for seq in taken)
        for seq, header in zip(taken, headers, strict=True):
            del by_key[header.key]
            tombs.discard(seq)
        self.last_run_seq = run
        self.headers[run] = headers
        self.seqs.append(run)
        for header in headers:
            self.ghosts.setdefault(header.key, []).append((run, header.vector))
        self.collected_versions += len(headers)
        self.collected_bytes += size
        return size

    def release(self, floor: int) -> list[int]:
        """Drop the runs every device has pulled past (seq ≤ `floor`); their seqs."""
        released = self.seqs[: bisect.bisect_right(self.seqs, floor)]
        for run in released:
            for header in self.headers.pop(run):
                kept = [g for g in self.ghosts[header.key] if g[0] != run]
                if kept:
                    self.ghosts[header.key] = kept
                else:
                    del self.ghosts[header.key]
        del self.seqs[: len(released)]
        return released

    def flag(self, flagged: Iterable[str], last: int | None) -> None:
        """`relay.sqlcollect.collect`'s flags: the stale devices, and every resync under way
        begun again once a run was made or released (`last`)."""
        self.resync.update(dict.fromkeys(flagged))
        if last is not None:
            self.resync = dict.fromkeys(self.resync)

    def standings(self, devices: Iterable[Device], acks: Acks) -> list[Standing]:
        """What collection knows of each device (`relay.collection.split`)."""
        standings = []
        for d in devices:
            ack, ack_ms = acks.get(d.id, (None, None))
            flagged = d.id in self.resync
            standings.append(
                Standing(d.id, ack, ack_ms, d.created_ms, flagged, self.resync.get(d.id))
            )
        return standings

    def check_pull(self, device_id: str | None, resync: bool, cursor: int, now_ms: int) -> None:
        """`relay.sqlcollect.refuse_unless_resynced` and `start_resync` (None: the caller is
        no device, as in the sans-I/O tests)."""
        if device_id is None or device_id not in self.resync:
            return
        if not resync:
            raise ResyncRequiredError()
        if cursor == 0 and self.resync[device_id] is None:
            self.resync[device_id] = now_ms

    def check_push(self, device_id: str, envelopes: int, ack: int | None) -> None:
        """`relay.sqlcollect.resync_refusal`, raised."""
        if device_id not in self.resync:
            return
        if envelopes or ack is None or ack < self.last_run_seq or self.resync[device_id] is None:
            raise ResyncRequiredError()
        del self.resync[device_id]

    def ghosts_of(self, key: bytes) -> list[VersionVector]:
        return [vector for _, vector in self.ghosts.get(key, ())]

    def next_run(self, cursor: int) -> int | None:
        index = bisect.bisect_right(self.seqs, cursor)
        return self.seqs[index] if index < len(self.seqs) else None

    def markers(self, run: int) -> CollectedRun:
        """In the order SQL storage sends them: by key, node as stored (i64), hlc."""
        dots = sorted((h.key, node_to_i64(h.node), h.hlc, h.node) for h in self.headers[run])
        return CollectedRun(run, pack_markers((key, node, hlc) for key, _, hlc, node in dots))


def candidates(
    tombs: set[int],
    by_seq: dict[int, bytes],
    by_key: dict[bytes, list[StoredVersion]],
    floor: int,
    limit: int,
) -> list[int]:
    """`relay.sqlcollect.CANDIDATES`: declared tombstones at or below `floor` that are their
    key's sole stored version, by seq."""
    taken: list[int] = []
    for seq in sorted(tombs):
        if seq > floor or len(taken) == limit:
            break
        if len(by_key[parse_header(by_seq[seq]).key]) == 1:
            taken.append(seq)
    return taken
