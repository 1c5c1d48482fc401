"""One account of the in-memory reference relay (`relay.memory`): what it stores, and its
line of `accounts`."""

from __future__ import annotations

from dataclasses import dataclass, field

from relay.collection import waited_for
from relay.memcollect import Runs
from relay.storage import AccountRecord, AccountSummary, Device
from relay.versions import StoredVersion


@dataclass
class MemoryAccount:
    """What the reference relay keeps of one account (its lock is the relay's)."""

    epoch: str
    record: AccountRecord | None = None
    head: int = 0
    stored_bytes: int = 0
    by_key: dict[bytes, list[StoredVersion]] = field(default_factory=dict)
    by_seq: dict[int, bytes] = field(default_factory=dict)
    """seq → envelope of every stored version."""
    seqs: list[int] = field(default_factory=list)
    devices: dict[str, Device] = field(default_factory=dict)
    push_counters: dict[str, int] = field(default_factory=dict)
    """device id → the highest signed-push counter it used."""
    acks: dict[str, tuple[int, int]] = field(default_factory=dict)
    """device id → (the cursor it last acknowledged, when: relay clock)."""
    tombs: set[int] = field(default_factory=set)
    """seqs of the stored versions declared tombstones."""
    runs: Runs = field(default_factory=Runs)

    def summary(
        self, name: str, created_ms: int, now_ms: int, horizon_ms: int | None
    ) -> AccountSummary:
        """`Storage.accounts`' line for this account, named `name`."""
        standings = self.runs.standings(self.devices.values(), self.acks)
        floor, held_back_by = waited_for(standings, now_ms, horizon_ms)
        return AccountSummary(
            name,
            created_ms,
            len(self.devices),
            len(self.by_seq),
            self.stored_bytes,
            self.head,
            len(self.tombs),
            sum(len(self.by_seq[seq]) for seq in self.tombs),
            floor,
            self.runs.collected_versions,
            self.runs.collected_bytes,
            held_back_by,
            len(self.runs.resync),
        )
