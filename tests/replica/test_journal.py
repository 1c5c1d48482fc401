"""Journals (replica/journal.py): bounded, ordered, sealed logs that stay on this device."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replica import (
    Collection,
    DeferredWrite,
    DegradedError,
    InvalidArgumentError,
    Replica,
    ReplicaLockedError,
    ReplicaOptions,
    Schema,
    backup_replica_file,
)
from replica.limits import MAX_ID_CHARS
from tests.conftest import Account, ReplicaFactory
from tests.replica.helpers import apply, dirty_envelopes


def entries(replica: Replica, name: str = "log", profile: str = "default") -> list[Any]:
    """Pop every entry, newest first."""
    popped = []
    while (entry := replica.journal_pop("drafts", name, profile=profile)) is not None:
        popped.append(entry.document)
    return popped


def test_a_journal_keeps_its_newest_entries_and_pops_them_newest_first(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    for i in range(7):
        replica.journal_push("drafts", "log", {"op": i}, keep=3)
    assert replica.journal_count("drafts", "log") == 3
    assert entries(replica) == [{"op": 6}, {"op": 5}, {"op": 4}]
    assert replica.journal_count("drafts", "log") == 0
    replica.journal_push("drafts", "log", {"op": "again"}, keep=3)
    assert entries(replica) == [{"op": "again"}]


def test_journals_are_apart_by_name_and_profile(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    replica.create_profile("work")
    replica.journal_push("drafts", "a", 1, keep=10)
    replica.journal_push("drafts", "b", 2, keep=10)
    replica.journal_push("drafts", "a", 3, keep=10, profile="work")
    for _ in range(20):  # trimming one journal never touches another
        replica.journal_push("drafts", "c", 0, keep=1)
    assert entries(replica, "a") == [1]
    assert entries(replica, "b") == [2]
    assert entries(replica, "a", "work") == [3]
    assert entries(replica, "c") == [0]


def test_a_journal_survives_a_restart_and_is_shared_by_handles(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    replica.journal_push("drafts", "log", {"n": 1}, keep=5)
    other = Replica.open(replica.path)
    other.unlock_with_key(replica.unlock_key())
    try:
        other.journal_push("drafts", "log", {"n": 2}, keep=5)
    finally:
        other.close()
    assert entries(replica) == [{"n": 2}, {"n": 1}]


def test_entries_are_sealed_and_never_sync_or_reach_the_feed(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    head = replica.feed_head()
    replica.journal_push("drafts", "secret-log", {"text": "plaintext-marker"}, keep=5)
    key = replica.unlock_key()
    replica.close()
    raw = Path(replica.path).read_bytes()  # closing checkpointed the WAL into the file
    assert b"plaintext-marker" not in raw and b"secret-log" not in raw
    reopened = Replica.open(replica.path)
    reopened.unlock_with_key(key)
    try:
        assert reopened.changes(head).changes == []
        assert reopened.status().dirty == 0 and reopened.status().records == 0
        assert entries(reopened, "secret-log") == [{"text": "plaintext-marker"}]
    finally:
        reopened.close()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r: r.journal_push("notes", "log", 1, keep=5), "local collections"),
        (lambda r: r.journal_push("nope", "log", 1, keep=5), "nope"),
        (lambda r: r.journal_push("drafts", "log", 1, keep=0), "keep must be"),
        (lambda r: r.journal_push("drafts", "log", 1, keep=True), "keep must be"),
        (lambda r: r.journal_push("drafts", "", 1, keep=5), "journal name"),
        (lambda r: r.journal_push("drafts", "x" * (MAX_ID_CHARS + 1), 1, keep=5), "bounds"),
        (lambda r: r.journal_push("drafts", "log", 1, keep=5, profile="ghost"), "ghost"),
        (lambda r: r.journal_pop("versioned", "log"), "local collections"),
        (lambda r: r.journal_push("drafts", ["log"], 1, keep=5), "journal name"),
    ],
)
def test_bad_arguments_are_refused_and_change_nothing(
    make_replica: ReplicaFactory, call: Any, message: str
) -> None:
    replica = make_replica()
    replica.journal_push("drafts", "log", "kept", keep=5)
    with pytest.raises(InvalidArgumentError, match=message):
        call(replica)
    assert entries(replica) == ["kept"]


def test_a_document_past_the_bound_is_refused(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    with pytest.raises(InvalidArgumentError, match="bytes as MessagePack, bound"):
        replica.journal_push("drafts", "log", "x" * (2 << 20), keep=5)
    assert replica.journal_count("drafts", "log") == 0


def test_a_locked_replica_neither_pushes_nor_pops(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    replica.journal_push("drafts", "log", 1, keep=5)
    replica.lock()
    with pytest.raises(ReplicaLockedError):
        replica.journal_push("drafts", "log", 2, keep=5)
    with pytest.raises(ReplicaLockedError):
        replica.journal_pop("drafts", "log")


def _swap_newest_two(path: Path, *, with_key: bool = False) -> None:
    """Swap the envelopes (and, `with_key`, the key columns) of a journal's newest rows."""
    with sqlite3.connect(path) as db:
        (a, key_a, env_a), (b, key_b, env_b) = db.execute(
            "SELECT seq, key, envelope FROM journal ORDER BY seq DESC LIMIT 2"
        ).fetchall()
        if not with_key:
            key_a, key_b = key_b, key_a  # each row keeps its own key
        db.execute("UPDATE journal SET key = ?, envelope = ? WHERE seq = ?", (key_b, env_b, a))
        db.execute("UPDATE journal SET key = ?, envelope = ? WHERE seq = ?", (key_a, env_a, b))


def test_an_entry_moved_to_another_place_fails_closed_until_repair_quarantines_it(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    for i in range(3):
        replica.journal_push("drafts", "log", i, keep=5)
    _swap_newest_two(Path(replica.path))
    with pytest.raises(DegradedError):
        replica.journal_pop("drafts", "log")
    assert replica.journal_count("drafts", "log") == 3  # nothing dropped
    report = replica.repair()
    assert report.quarantined == 2
    assert entries(replica) == [0]
    assert replica.diagnose().healthy


def test_a_repair_keeps_the_journal_within_its_bound(make_replica: ReplicaFactory) -> None:
    """The rows past the bound wait for a sweep; a repair that takes the newest row hands its
    floor on, so they never come back."""
    replica = make_replica()
    for i in range(1, 6):
        replica.journal_push("drafts", "log", i, keep=3)
    with sqlite3.connect(replica.path) as db:
        db.execute("UPDATE journal SET envelope = substr(envelope, 1, 40) WHERE seq = 5")
    with pytest.raises(DegradedError):
        replica.journal_pop("drafts", "log")
    assert replica.repair().quarantined == 1
    assert replica.journal_count("drafts", "log") == 2
    assert entries(replica) == [4, 3]


def test_a_push_after_a_repair_took_the_newest_rows_is_kept(
    make_replica: ReplicaFactory,
) -> None:
    """A repair that takes the newest rows leaves a floor above the head: the next entry goes
    at the floor, not below it, where it would be out of the journal."""
    replica = make_replica()
    for i in range(1, 7):
        replica.journal_push("drafts", "log", i, keep=1)
    with sqlite3.connect(replica.path) as db:
        db.execute("UPDATE journal SET envelope = substr(envelope, 1, 40) WHERE seq >= 4")
    assert replica.repair().quarantined == 3
    replica.journal_push("drafts", "log", "new", keep=1)
    assert replica.journal_count("drafts", "log") == 1
    assert entries(replica) == ["new"]


def test_an_entry_moved_with_its_key_is_found_and_quarantined(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    for i in range(3):
        replica.journal_push("drafts", "log", i, keep=5)
    _swap_newest_two(Path(replica.path), with_key=True)
    with pytest.raises(DegradedError):
        replica.journal_pop("drafts", "log")
    assert {f.table for f in replica.diagnose().findings} == {"journal"}
    assert replica.repair().quarantined == 2
    assert entries(replica) == [0]


def test_an_entry_moved_with_its_key_to_another_journal_is_found(
    make_replica: ReplicaFactory,
) -> None:
    """Same place, another journal: only the id the entry was sealed under tells."""
    replica = make_replica()
    for name in ("a", "b"):
        replica.journal_push("drafts", name, name, keep=5)
    with sqlite3.connect(replica.path) as db:
        rows = db.execute("SELECT log, key, envelope FROM journal").fetchall()
        for (log, _, _), (_, key, envelope) in zip(rows, reversed(rows), strict=True):
            db.execute(
                "UPDATE journal SET key = ?, envelope = ? WHERE log = ?", (key, envelope, log)
            )
    assert len(replica.diagnose().findings) == 2
    assert replica.repair().quarantined == 2
    assert entries(replica, "a") == entries(replica, "b") == []


def test_a_records_envelope_never_passes_for_an_entry(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    replica.journal_push("drafts", "log", {"op": "real"}, keep=5)
    for id in ("log/1", "x"):
        replica.put("drafts", id, {"op": "planted"})
    with sqlite3.connect(replica.path) as db:
        (planted,) = db.execute("SELECT envelope FROM local LIMIT 1").fetchone()
        db.execute("UPDATE journal SET envelope = ?", (planted,))
    assert not replica.diagnose().healthy
    with pytest.raises(DegradedError):
        replica.journal_pop("drafts", "log")


def test_a_journal_follows_a_declare_that_changes_its_collection(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    replica.declare(Schema((*replica.schema.collections, Collection("undo", "local"))))
    replica.journal_push("undo", "log", 1, keep=5)
    others = tuple(c for c in replica.schema.collections if c.name != "undo")
    replica.declare(Schema((*others, Collection("undo", "lww"))))
    with pytest.raises(InvalidArgumentError, match="local collections"):
        replica.journal_push("undo", "log", 2, keep=5)
    with pytest.raises(InvalidArgumentError, match="reserved"):
        Schema((Collection("sealsync.journal", "local"),))


def test_a_backup_leaves_journals_and_leases_out(
    make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    replica = make_replica()
    replica.journal_push("drafts", "log", 1, keep=5)
    replica.put("notes", "n", {"shared": True})
    with replica.lease("job"):
        backup_replica_file(Path(replica.path), tmp_path / "backup.db")
    with sqlite3.connect(tmp_path / "backup.db") as db:
        assert db.execute("SELECT count(*) FROM journal").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM leases").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM versions").fetchone() == (1,)
    assert replica.journal_count("drafts", "log") == 1


@settings(max_examples=80, deadline=None)
@given(steps=st.lists(st.one_of(st.integers(1, 6), st.none()), max_size=60))
def test_a_journal_behaves_as_a_bounded_stack(
    make_replica: ReplicaFactory, steps: list[int | None]
) -> None:
    """Pushes (with `keep` drawn each time) and pops (None) in any order match a list that
    each push cuts to its newest `keep`, across the sweeps every 16th push makes."""
    replica = make_replica()
    model: list[int] = []
    for number, keep in enumerate(steps):
        if keep is None:
            entry = replica.journal_pop("drafts", "log")
            assert (entry and entry.document) == (model.pop() if model else None)
        else:
            replica.journal_push("drafts", "log", number, keep=keep)
            model = [*model, number][-keep:]
        assert replica.journal_count("drafts", "log") == len(model)
    replica.close()


def test_a_deferred_entry_is_handed_over_once_oldest_first_even_once_replaced(
    make_replica: ReplicaFactory, account: Account
) -> None:
    """Writes made with `deferred_entry` wait in the file (across a restart) until the next
    `journal_deferred`, which hands over the newest `keep`, oldest first, and clears them
    all; one another device's version replaced since (in place) is handed over too: the
    write was made here, and an app's log counts it."""
    a, b = make_replica("a", freshness_window_s=0), make_replica("b", freshness_window_s=0)
    for i in range(4):
        a.put("notes", f"n{i}", {"i": i}, deferred_entry=("drafts", "log"))
    a.put("notes", "plain", {"i": 9})
    a.put("notes", "n1", {"i": "rewritten"})  # a later write of n1 defers nothing
    path = a.path
    a.close()
    a = Replica.open(path, options=ReplicaOptions(freshness_window_s=0))
    a.unlock_with_key(account.key)
    with a:
        assert [w.id for w in a.journal_deferred("drafts", "log", keep=2)] == ["n2", "n3"]
        assert a.journal_deferred("drafts", "log", keep=2) == []
        a.put("notes", "taken", {"by": "a"}, deferred_entry=("drafts", "log"))
        apply(b, dirty_envelopes(a))
        b.put("notes", "taken", {"by": "b"}, context=b.get("notes", "taken").context)  # type: ignore[union-attr]
        apply(a, dirty_envelopes(b))
        assert a.get("notes", "taken").document == {"by": "b"}  # type: ignore[union-attr]
        a.put("notes", "kept", {"i": 1}, deferred_entry=("drafts", "log"))
        handed = a.journal_deferred("drafts", "log", keep=5)
        assert handed == [DeferredWrite("notes", "taken"), DeferredWrite("notes", "kept")]
        assert a.journal_count("drafts", "log") == 0  # the caller pushes the entries


def test_bad_deferred_entries_are_refused_and_change_nothing(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    before = replica.journal_deferred("drafts", "log", keep=1)
    for journal, why in (
        (("notes", "log"), "local"),  # a journal lives in a local collection
        (("drafts", ""), "journal name"),
        (["drafts", "log"], "collection, name"),
    ):
        with pytest.raises(InvalidArgumentError, match=why):
            replica.put("notes", "n", {"x": 1}, deferred_entry=journal)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="cannot defer"):
        replica.put("drafts", "d", {"x": 1}, deferred_entry=("drafts", "log"))
    with pytest.raises(InvalidArgumentError, match="keep"):
        replica.journal_deferred("drafts", "log", keep=0)
    assert replica.get("notes", "n") is None and replica.get("drafts", "d") is None
    assert before == replica.journal_deferred("drafts", "log", keep=1) == []


def test_a_backup_holds_no_write_awaiting_an_entry(
    make_replica: ReplicaFactory, account: Account, tmp_path: Path
) -> None:
    """The journal stays on this device: so do the entries its writes defer."""
    replica = make_replica()
    replica.put("notes", "n", {"x": 1}, deferred_entry=("drafts", "log"))
    backup_replica_file(replica.path, tmp_path / "backup.db")
    with Replica.open(tmp_path / "backup.db") as copy:
        copy.unlock_with_key(account.key)
        assert copy.journal_deferred("drafts", "log", keep=1) == []
        assert copy.get("notes", "n") is not None
    assert replica.journal_deferred("drafts", "log", keep=1) == [DeferredWrite("notes", "n")]
