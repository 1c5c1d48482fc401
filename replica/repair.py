"""Diagnose and repair a replica whose rows cannot all be opened (docs/architecture.md §6.1).

Diagnosis opens every stored row and sorts each failure into *corrupt* (the bytes are not a
well-formed envelope for that row: a damaged header, a truncated body, an envelope in another
record's row) or *undecryptable* (well formed, but authentication fails: tampered, or sealed
under another key). Repair moves the unreadable rows verbatim into the quarantine table with
the reason, unlatches the degraded records, and resets the pull cursor so the relay's versions
are merged again against the repaired siblings, and recomputes the blind indexes. When more
than half of the rows (and more than one) are undecryptable the cause is almost surely a key
mismatch, not damage: repair then refuses unless forced, and says to restore the matching key
or backup. A quarantined version that opens with the keys held now (the right key arrived)
is merged again, verified.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from replica.asides import Row
from replica.core import Core
from replica.errors import EnvelopeError, ProtocolError, RepairRefusedError, UnknownEpochError
from replica.indexed import rebuild
from replica.journal import entry_identity, journal_row
from replica.wire import Header, node_from_i64, node_to_i64, parse_header
from replica.write import local_row

Damage = Literal["corrupt", "undecryptable"]


@dataclass(frozen=True)
class Finding:
    """One unreadable row: where it is, what is wrong, and why (`journal`: the row's journal
    key; its place is `row.hlc`)."""

    table: str
    row: Row
    damage: Damage
    reason: str
    journal: bytes | None = None


@dataclass(frozen=True)
class Diagnosis:
    rows: int
    findings: tuple[Finding, ...]
    degraded_records: int

    @property
    def corrupt(self) -> int:
        return sum(f.damage == "corrupt" for f in self.findings)

    @property
    def undecryptable(self) -> int:
        return sum(f.damage == "undecryptable" for f in self.findings)

    @property
    def healthy(self) -> bool:
        return not self.findings and self.degraded_records == 0

    @property
    def verdict(self) -> str:
        if self.healthy:
            return "healthy"
        return "undecryptable" if self.undecryptable > self.corrupt else "corrupt"


@dataclass(frozen=True)
class RepairReport:
    quarantined: int
    unlatched_records: int
    readmitted: int
    """Quarantined versions that opened with the keys held now, and were merged again."""


READMITTED_SOURCES = ("pull", "held", "versions")
"""Where a quarantined version can go back to by merging. Drafts (`local`), journal entries
and replaced versions (`history`) stay: merging would not put them back where they were."""


StoredRow = tuple[str, Row, bytes | None, bytes | None]
"""(table, row, the vector column of a `versions` row, the journal key of a `journal` row)."""


def _stored_rows(core: Core, scope: bytes | None) -> Iterator[StoredRow]:
    """Every stored row, read as it is checked (a million rows are not held at once)."""
    store = core.store
    where, args = ("", ()) if scope is None else (" WHERE scope = ?", (scope,))
    for key, node, hlc, vector, envelope in store.db.execute(
        f"SELECT key, node, hlc, vector, envelope FROM versions{where}", args
    ):
        yield "versions", Row(key, node_from_i64(node), hlc, envelope), vector, None
    for key, envelope in store.db.execute(f"SELECT key, envelope FROM local{where}", args):
        yield "local", local_row(key, envelope), None, None
    for log, seq, key, envelope in store.db.execute(
        f"SELECT log, seq, key, envelope FROM journal{where}", args
    ):
        yield "journal", journal_row(key, seq, envelope), None, log
    if scope is None:
        for key, node, hlc, envelope in store.db.execute(
            "SELECT key, node, hlc, envelope FROM history"
        ):
            yield "history", Row(key, node_from_i64(node), hlc, envelope), None, None


def _check_row(core: Core, stored: StoredRow) -> Finding | None:
    table, row, vector, log = stored
    opener = core.opener_or_raise()

    def finding(damage: Damage, reason: str) -> Finding:
        return Finding(table, row, damage, reason, log)

    try:
        header = parse_header(row.envelope)
    except ProtocolError as exc:
        return finding("corrupt", f"malformed header: {exc}")
    if (header.key, header.node, header.hlc) != (row.key, row.node, row.hlc):
        return finding("corrupt", "envelope does not belong to its row")
    if vector is not None and vector != header.vector_bytes:
        return finding("corrupt", "the row's vector column differs from its header")
    try:
        opened = opener.open(row.envelope, header)
    except EnvelopeError as exc:
        return finding("undecryptable", str(exc))
    except UnknownEpochError as exc:
        return finding("corrupt", str(exc))
    if log is not None and opened.identity != entry_identity(opened.identity.profile, log, row.hlc):
        return finding("corrupt", "the entry was sealed for another journal or place")
    return None


def diagnose(core: Core, scope: bytes | None = None) -> Diagnosis:
    """Open every stored row (of one scope, or all) and report the ones that fail; refused
    to a handle whose keys another process replaced (what they cannot open is not damage)."""
    core.opener_or_raise()
    core.refuse_stale_keys()
    count = 0
    findings = []
    for stored in _stored_rows(core, scope):
        count += 1
        finding = _check_row(core, stored)
        if finding is not None:
            findings.append(finding)
    return Diagnosis(count, tuple(findings), core.store.count_degraded())


def repair(core: Core, *, force: bool = False, scope: bytes | None = None) -> RepairReport:
    """Quarantine every unreadable row verbatim and unlatch the degraded records."""
    with core.write_transaction():
        diagnosis = diagnose(core, scope)
        if (
            diagnosis.undecryptable * 2 > diagnosis.rows
            and diagnosis.undecryptable > 1
            and not force
        ):
            raise RepairRefusedError(
                f"{diagnosis.undecryptable} of {diagnosis.rows} rows are undecryptable: "
                "this looks like a key mismatch, not damage",
                hint="unlock with the matching key or restore the matching backup; "
                "force the repair only if you accept losing those rows to quarantine",
            )
        now = core.options.wall_clock_ms()
        for finding in diagnosis.findings:
            _quarantine_row(core, finding, now)
        _announce_repaired(core, diagnosis.findings)
        if diagnosis.findings or diagnosis.degraded_records:
            # A damaged row may have made merging drop versions it seemed to cover, and a
            # record latched by a pulled forgery may have lost its genuine copy: pull
            # everything again and merge it against the repaired siblings (idempotent).
            core.store.set_meta("cursor", 0)
        unlatched = core.store.count_degraded()
        if scope is None:
            core.store.clear_degraded()
        else:
            core.store.db.execute(  # latched by a pulled forgery, the scope may be unknown
                "DELETE FROM degraded WHERE scope = ? OR key IN "
                "(SELECT key FROM versions WHERE scope = ?)",
                (scope, scope),
            )
            unlatched -= core.store.count_degraded()
        readmitted = readmit(core) if scope is None else 0
        rebuild(core, None if scope is None else [scope])
    if core.opener is not None:
        core.opener.forget()
    return RepairReport(len(diagnosis.findings), unlatched, readmitted)


def readmit(core: Core) -> int:
    """Merge again, inside the caller's transaction, every quarantined version that opens
    with the keys held now (a repair forced under another key, then the right one unlocked),
    under the identity it was set aside as, and drop its quarantine row; how many. The
    merge verifies it as if it had just arrived. A genuine envelope found in another
    record's row stays: it is evidence of that row's damage, not a lost version.
    None under a retired key epoch is taken back: where it came from, and so whether the
    rotation's frontier vouches for it, is no longer known (specs/replica.md §7.1)."""
    opener, retired = core.opener_or_raise(), core.keys().retired_epochs
    ids: list[tuple[int]] = []
    envelopes: list[bytes] = []
    to_push: set[tuple[bytes, int, int]] = set()
    rows = core.store.db.execute(
        "SELECT id, source, key, node, hlc, envelope FROM quarantine"
        f" WHERE source IN ({', '.join('?' * len(READMITTED_SOURCES))}) ORDER BY id",
        READMITTED_SOURCES,
    )
    for rowid, source, key, node, hlc, envelope in rows.fetchall():
        try:
            header = parse_header(envelope)
            if header.epoch in retired or not _is_its_own(header, key, node, hlc):
                continue
            opener.open(envelope, header)
        except (ProtocolError, EnvelopeError, UnknownEpochError):
            continue
        ids.append((rowid,))
        envelopes.append(envelope)
        if source != "pull":  # it may never have reached the relay: pushing it again is safe
            to_push.add((header.key, header.node, header.hlc))
    if envelopes:
        # merged while their rows still name their dots, so this device's own versions are
        # not taken for a copied file's; what opens and is not retired is never set aside
        # in quarantine again (it may be held, or found covered)
        merged = core.merge(envelopes, now_ms=None, source="quarantine", to_push=frozenset(to_push))
        core.publish(merged.events)
        core.store.db.executemany("DELETE FROM quarantine WHERE id = ?", ids)
    return len(ids)


def _announce_repaired(core: Core, findings: tuple[Finding, ...]) -> None:
    """Each record that lost a row changed (replica/feed.py): its rows that remain get a new
    sequence number. A record left with none is gone, which the feed cannot show: the feed
    starts anew (a new id), so every follower reads everything again."""
    store = core.store
    keys = {f.row.key for f in findings if f.table in ("versions", "local")}
    if not keys:
        return
    seq = store.take_seqs(len(keys))
    store.set_changed(zip(range(seq, seq + len(keys)), sorted(keys), strict=True))
    if any(not store.versions_of(key) for key in keys):
        store.set_meta("feed_id", core.options.random_bytes(16).hex())


def _quarantine_row(core: Core, finding: Finding, now: int) -> None:
    store, row = core.store, finding.row
    reason = f"{finding.damage}: {finding.reason}"
    store.quarantine(finding.table, row.key, row.envelope, reason, now, (row.node, row.hlc))
    if finding.journal is not None:
        store.journal_remove(finding.journal, row.hlc)
    elif finding.table == "local":
        store.db.execute("DELETE FROM local WHERE key = ?", (row.key,))
    else:
        store.db.execute(
            f"DELETE FROM {finding.table} WHERE key = ? AND node = ? AND hlc = ?",
            (row.key, node_to_i64(row.node), row.hlc),
        )


def _is_its_own(header: Header, key: bytes | None, node: int | None, hlc: int | None) -> bool:
    """Whether an envelope names the identity its quarantine row was kept under (NULL: not
    known, as for a pulled envelope whose header did not parse then)."""
    if key is not None and key != header.key:
        return False
    return node is None or (node_from_i64(node), hlc) == (header.node, header.hlc)
