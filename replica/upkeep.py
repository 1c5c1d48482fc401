"""The methods of a `Replica` that look after its file: what state it is in (`status`), which
rows do not open (`diagnose`) and setting them aside (`repair`, specs/replica.md §7),
giving freed pages back to the disk (`compact`, replica/compaction.py), and what a full
resync set aside (`set_aside`, `take_aside`, replica/aside.py).

A mixin of `Replica` (replica/replica.py), which owns the `Core` these work through.
"""

from __future__ import annotations

from replica import aside, compaction, repair
from replica.aside import AsideVersion
from replica.compaction import Compacted
from replica.core import Core
from replica.envelope import Identity
from replica.record import Context
from replica.repair import Diagnosis, RepairReport
from replica.schema import DEFAULT_PROFILE
from replica.status import Status, read_status


class Upkeep:
    """Status, diagnose, repair, compact and set-aside versions of a `Replica`."""

    _core: Core

    def status(self) -> Status:
        core = self._core
        with core.mutex:
            core.check_open()
            return read_status(core.store, locked=core.opener is None, node=core.node())

    def diagnose(self) -> Diagnosis:
        """Open every stored row and report the unreadable ones (changes nothing)."""
        with self._core.mutex:
            return repair.diagnose(self._core)

    def repair(self, *, force: bool = False) -> RepairReport:
        """Quarantine unreadable rows verbatim and unlatch degraded records.

        Refuses (`RepairRefusedError`) when more than half the rows are undecryptable — a key
        mismatch, not damage — unless `force`.
        """
        with self._core.mutex:
            return repair.repair(self._core, force=force)

    def compact(self) -> Compacted:
        """Rewrite the file without its free pages (works locked; refused inside `batch()`,
        and with `StoreError` while another process keeps writing): the bytes before and
        after. Deleted records and collected tombstones leave free pages that only this
        gives back to the disk."""
        core = self._core
        with core.mutex:
            core.check_open()
            return compaction.compact(core)

    def set_aside(self) -> list[AsideVersion]:
        """The versions a full resync set aside (specs/replica.md §2): kept here, never
        merged or pushed, since either could bring back what the relay collected."""
        with self._core.mutex:
            return aside.set_aside(self._core)

    def take_aside(self, collection: str, id: str, *, profile: str = DEFAULT_PROFILE) -> Context:
        """Write the record's newest version set aside back as a new version, over what it
        shows now, and drop what was set aside of it; the record's context after."""
        with self._core.mutex:
            return aside.take_aside(self._core, Identity(profile, collection, id))
