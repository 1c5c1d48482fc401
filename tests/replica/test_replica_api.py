"""The replica API (specs/replica.md): reads, writes, contexts, conflicts, policies, profiles,
subscriptions, clones and locking."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from replica import (
    REGISTER_ID,
    ChangeEvent,
    Collection,
    InvalidArgumentError,
    ItemLimitError,
    ReplicaClosedError,
    ReplicaLockedError,
    ReplicaOptions,
    Schema,
    StaleContextError,
)
from replica.replica import Replica
from tests.conftest import SCHEMA, Account, FakeClock, ReplicaFactory
from tests.replica.helpers import apply, dirty_envelopes, page_of


def test_put_then_get_returns_the_document_and_its_context(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    context = replica.put("notes", "n1", {"text": "hello", "n": [1, 2.5, None, True]})
    record = replica.get("notes", "n1")
    assert record is not None
    assert record.document == {"text": "hello", "n": [1, 2.5, None, True]}
    assert record.context == context and len(context) == 1
    assert (record.node, record.hlc) in context and record.conflicts == ()


def test_get_of_a_record_never_written_is_none(make_replica: ReplicaFactory) -> None:
    assert make_replica().get("notes", "absent") is None


def test_delete_leaves_a_tombstone_and_a_later_put_restores(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    replica.put("notes", "n1", {"v": 1})
    replica.delete("notes", "n1")
    record = replica.get("notes", "n1")
    assert record is not None and record.deleted and record.document is None
    assert replica.scan("notes") == [] and len(replica.scan("notes", include_deleted=True)) == 1
    replica.put("notes", "n1", {"v": 2})
    restored = replica.get("notes", "n1")
    assert restored is not None and restored.document == {"v": 2} and not restored.deleted


def test_a_sibling_merged_after_the_read_stays_a_conflict(make_replica: ReplicaFactory) -> None:
    clock = FakeClock()
    a = make_replica("a", wall_clock_ms=clock, freshness_window_s=0)
    b = make_replica("b", wall_clock_ms=clock, freshness_window_s=0)
    a.put("notes", "n", {"v": "base"})
    apply(b, dirty_envelopes(a))
    read = a.get("notes", "n")
    assert read is not None
    clock.advance(5)
    b.put("notes", "n", {"v": "from b"})
    apply(a, dirty_envelopes(b))
    clock.advance(5)
    a.put("notes", "n", {"v": "from a"}, context=read.context)
    record = a.get("notes", "n")
    assert record is not None and record.document == {"v": "from a"}
    assert [c.document for c in a.conflicts("notes", "n")] == [{"v": "from b"}]
    a.put("notes", "n", {"v": "resolved"}, context=record.context)
    apply(b, dirty_envelopes(a))
    for replica in (a, b):
        resolved = replica.get("notes", "n")
        assert resolved is not None and resolved.document == {"v": "resolved"}
        assert resolved.conflicts == ()


def test_put_without_context_replaces_every_sibling(make_replica: ReplicaFactory) -> None:
    clock = FakeClock()
    a = make_replica("a", wall_clock_ms=clock, freshness_window_s=0)
    b = make_replica("b", wall_clock_ms=clock, freshness_window_s=0)
    a.put("notes", "n", {"v": 1})
    b.put("notes", "n", {"v": 2})
    apply(a, dirty_envelopes(b))
    assert len(a.conflicts("notes", "n")) == 1
    a.put("notes", "n", {"v": 3})
    record = a.get("notes", "n")
    assert record is not None and record.conflicts == () and len(record.context) == 1


def test_conditional_write_refuses_when_siblings_changed(make_replica: ReplicaFactory) -> None:
    clock = FakeClock()
    a = make_replica("a", wall_clock_ms=clock, freshness_window_s=0)
    b = make_replica("b", wall_clock_ms=clock, freshness_window_s=0)
    a.put("notes", "n", {"v": 1})
    read = a.get("notes", "n")
    assert read is not None
    b.put("notes", "n", {"v": 2})
    apply(a, dirty_envelopes(b))
    before = a.get("notes", "n")
    with pytest.raises(StaleContextError, match="changed since it was read"):
        a.put("notes", "n", {"v": 3}, context=read.context, if_unchanged=True)
    assert a.get("notes", "n") == before
    assert before is not None
    a.put("notes", "n", {"v": 3}, context=before.context, if_unchanged=True)


def test_a_stale_context_that_misses_this_devices_own_write_is_refused(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica(freshness_window_s=0)
    replica.put("notes", "n", {"v": 1})
    read = replica.get("notes", "n")
    assert read is not None
    replica.put("notes", "n", {"v": 2})
    with pytest.raises(StaleContextError, match="written on this device"):
        replica.put("notes", "n", {"v": 3}, context=read.context)


def test_tiebreak_decides_equal_hlc_and_nodes_decide_the_rest(make_replica: ReplicaFactory) -> None:
    clock = FakeClock()
    a = make_replica("a", wall_clock_ms=clock, freshness_window_s=0)
    b = make_replica("b", wall_clock_ms=clock, freshness_window_s=0)
    a.put("threads", "t", {"title": "a", "message_count": 5})
    b.put("threads", "t", {"title": "b", "message_count": 3})
    ea, eb = dirty_envelopes(a), dirty_envelopes(b)
    apply(a, eb)
    apply(b, ea)
    ra, rb = a.get("threads", "t"), b.get("threads", "t")
    assert ra is not None and rb is not None and ra.hlc == rb.hlc
    assert ra.document["title"] == rb.document["title"] == "a"  # more messages wins
    a.put("notes", "x", {"v": "a"})
    b.put("notes", "x", {"v": "b"})
    ea, eb = dirty_envelopes(a), dirty_envelopes(b)
    apply(a, eb)
    apply(b, ea)
    winner = "a" if a.node > b.node else "b"
    for replica in (a, b):
        got = replica.get("notes", "x")
        assert got is not None and got.document == {"v": winner}


def test_a_document_wins_over_a_tombstone_of_equal_hlc(make_replica: ReplicaFactory) -> None:
    clock = FakeClock()
    a = make_replica("a", wall_clock_ms=clock, freshness_window_s=0)
    b = make_replica("b", wall_clock_ms=clock, freshness_window_s=0)
    a.delete("notes", "x")
    b.put("notes", "x", {"v": "live"})
    ea, eb = dirty_envelopes(a), dirty_envelopes(b)
    apply(a, eb)
    apply(b, ea)
    for replica in (a, b):
        got = replica.get("notes", "x")
        assert got is not None and not got.deleted and got.document == {"v": "live"}
        assert [c.deleted for c in got.conflicts] == [True]


def test_register_has_one_value_per_profile(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    replica.put("active_persona", REGISTER_ID, {"persona": "p1"})
    with pytest.raises(InvalidArgumentError, match="register"):
        replica.put("active_persona", "other", {"persona": "p2"})


def test_max_items_bounds_local_writes_but_merges_drop_nothing(
    make_replica: ReplicaFactory,
) -> None:
    clock = FakeClock()
    a = make_replica("a", wall_clock_ms=clock)
    b = make_replica("b", wall_clock_ms=clock)
    for i in range(3):
        a.put("personas", f"a{i}", {"name": f"a{i}"})
        b.put("personas", f"b{i}", {"name": f"b{i}"})
    with pytest.raises(ItemLimitError, match="max_items 3"):
        a.put("personas", "a3", {"name": "too many"})
    a.put("personas", "a0", {"name": "editing an item is fine"})
    apply(a, dirty_envelopes(b))
    assert len(a.scan("personas")) == 6
    for id in ("a1", "a2", "b0"):
        a.delete("personas", id)
    with pytest.raises(ItemLimitError):  # three live items remain
        a.put("personas", "new", {})
    a.delete("personas", "b1")
    a.put("personas", "new", {})
    assert len(a.scan("personas")) == 3


def test_local_records_are_never_pushed(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    replica.put("drafts", "d1", {"text": "unsent"})
    replica.put("notes", "n1", {"text": "sent"})
    envelopes = dirty_envelopes(replica)
    assert len(envelopes) == 1
    draft = replica.get("drafts", "d1")
    assert draft is not None and draft.document == {"text": "unsent"}
    assert [r.id for r in replica.scan("drafts")] == ["d1"]
    replica.delete("drafts", "d1")
    assert replica.scan("drafts") == []


def test_history_keeps_the_last_versions_of_a_record(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    for v in range(6):
        replica.put("versioned", "h", {"v": v})
    assert [x.document for x in replica.history("versioned", "h")] == [{"v": 4}, {"v": 3}, {"v": 2}]


def test_unknown_collections_are_kept_and_applied_once_declared(
    tmp_path: Path, account: Account, make_replica: ReplicaFactory
) -> None:
    writer = make_replica("w")
    writer.put("notes", "n", {"v": 1})
    narrow = Schema((Collection("threads"),))
    reader = Replica.join(tmp_path / "narrow.db", account.bundle, schema=narrow)
    reader.unlock_with_key(account.key)
    apply(reader, dirty_envelopes(writer))
    assert reader.status().held_other == {"collection": 1}
    reader.declare(SCHEMA)
    got = reader.get("notes", "n")
    assert got is not None and got.document == {"v": 1}
    assert reader.status().held_other == {}
    reader.close()


def test_profiles_are_created_listed_synced_and_required(make_replica: ReplicaFactory) -> None:
    a, b = make_replica("a"), make_replica("b")
    assert a.profiles() == ["default"]
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        a.put("notes", "n", {}, profile="work")
    a.create_profile("work")
    a.put("notes", "n", {"v": "work"}, profile="work")
    assert a.get("notes", "n") is None
    apply(b, dirty_envelopes(a))
    assert b.profiles() == ["default", "work"]
    got = b.get("notes", "n", profile="work")
    assert got is not None and got.document == {"v": "work"}


def test_subscribers_hear_only_committed_changes(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    events: list[ChangeEvent] = []
    unsubscribe = replica.subscribe(events.append)
    replica.put("notes", "n1", {})
    with pytest.raises(RuntimeError), replica.batch():
        replica.put("notes", "n2", {})
        assert [e.id for e in events] == ["n1"]  # not before commit
        raise RuntimeError("roll back")
    assert replica.get("notes", "n2") is None
    assert [(e.kind, e.origin, e.id) for e in events] == [("changed", "local", "n1")]
    unsubscribe()
    replica.put("notes", "n3", {})
    assert len(events) == 1


def test_update_serializes_read_modify_write_across_threads(make_replica: ReplicaFactory) -> None:
    replica = make_replica(freshness_window_s=0)

    def bump() -> None:
        for _ in range(20):
            replica.update("notes", "counter", lambda doc: {"n": (doc or {"n": 0})["n"] + 1})

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    got = replica.get("notes", "counter")
    assert got is not None and got.document == {"n": 80}


def test_a_locked_replica_refuses_reads_and_writes_and_holds_pulls(
    make_replica: ReplicaFactory, account: Account
) -> None:
    writer, reader = make_replica("w"), make_replica("r")
    writer.put("notes", "n", {"v": 1})
    reader.lock()
    assert reader.is_locked
    with pytest.raises(ReplicaLockedError):
        reader.get("notes", "n")
    with pytest.raises(ReplicaLockedError):
        reader.put("notes", "n", {})
    apply(reader, dirty_envelopes(writer))
    assert reader.status().held_other == {"sealed": 1}
    reader.unlock_with_key(account.key)
    got = reader.get("notes", "n")
    assert got is not None and got.document == {"v": 1}


def test_a_closed_replica_refuses_everything(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    replica.close()
    with pytest.raises(ReplicaClosedError):
        replica.get("notes", "n")
    assert "closed" in repr(replica)


def test_reopening_keeps_everything(
    tmp_path: Path, make_replica: ReplicaFactory, account: Account
) -> None:
    replica = make_replica()
    replica.put("notes", "n", {"v": 1})
    node, path = replica.node, replica.path
    replica.close()
    again = Replica.open(path)
    assert again.is_locked
    again.unlock_with_key(account.key)
    got = again.get("notes", "n")
    assert got is not None and got.document == {"v": 1} and again.node == node
    again.close()


def test_a_copied_replica_takes_a_new_node_id_when_it_sees_its_twin(
    make_replica: ReplicaFactory, account: Account, tmp_path: Path
) -> None:
    original = make_replica("o", freshness_window_s=0)
    original.put("notes", "n", {"v": 1})
    dirty_envelopes(original)
    twin_path, path = tmp_path / "twin.db", original.path
    original.close()  # checkpoints the WAL into the file, so a file copy is whole
    shutil.copy(path, twin_path)
    original = Replica.open(path, options=ReplicaOptions(freshness_window_s=0))
    original.unlock_with_key(account.key)
    twin = Replica.open(twin_path)
    twin.unlock_with_key(account.key)
    assert twin.node == original.node
    twin.put("notes", "m", {"v": "twin"})
    events: list[ChangeEvent] = []
    original.subscribe(events.append)
    old = original.node
    apply(original, dirty_envelopes(twin))
    assert original.node != old
    assert original.status().node == original.node
    assert any(e.kind == "node_changed" for e in events)
    got = original.get("notes", "m")
    assert got is not None and got.document == {"v": "twin"}
    twin.close()
    original.close()


def test_a_restored_copy_takes_a_new_node_id_on_request_even_while_locked(
    make_replica: ReplicaFactory, account: Account
) -> None:
    replica = make_replica()
    replica.put("notes", "n", {"v": 1})
    old, path = replica.node, replica.path
    replica.close()
    copy = Replica.open(path)
    new = copy.take_new_node_id()
    assert new not in (0, old) and copy.node == new and copy.status().node == new
    copy.unlock_with_key(account.key)
    copy.put("notes", "m", {"v": 2})
    written = copy.get("notes", "m")
    assert written is not None and written.node == new
    copy.close()


def test_kdf_params_are_the_bundles_and_follow_a_passphrase_change(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    before = replica.kdf_params()
    replica.change_passphrase("a new passphrase")
    after = replica.kdf_params()
    assert after.salt != before.salt and after.memory_kib == before.memory_kib
    replica.lock()
    assert replica.kdf_params() == after
    replica.unlock("a new passphrase")


def test_if_unchanged_without_a_context_is_refused(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    with pytest.raises(InvalidArgumentError, match="needs the context"):
        replica.put("notes", "n", {}, if_unchanged=True)
    assert replica.get("notes", "n") is None


def test_device_local_records_honour_contexts(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    first = replica.put("drafts", "d", {"v": 1})
    replica.put("drafts", "d", {"v": 2}, context=first, if_unchanged=True)
    with pytest.raises(StaleContextError):
        replica.put("drafts", "d", {"v": 3}, context=first, if_unchanged=True)
    got = replica.get("drafts", "d")
    assert got is not None and got.document == {"v": 2}


def test_a_peer_version_of_a_collection_that_is_local_here_is_held(
    tmp_path: Path, account: Account, make_replica: ReplicaFactory
) -> None:
    synced_drafts = Schema((Collection("drafts", "lww"),))
    writer = Replica.join(tmp_path / "synced.db", account.bundle, schema=synced_drafts)
    writer.unlock_with_key(account.key)
    writer.put("drafts", "d", {"from": "peer"})
    reader = make_replica()
    reader.put("drafts", "d", {"from": "me"})
    apply(reader, dirty_envelopes(writer))
    assert reader.status().held_other == {"collection": 1}
    assert reader.status().degraded == 0
    got = reader.get("drafts", "d")
    assert got is not None and got.document == {"from": "me"}
    writer.close()


def test_a_closed_replicas_session_raises_the_typed_error(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    session = replica.sync_session()
    replica.close()
    for call in (
        lambda: replica.node,
        lambda: session.cursor,
        session.next_batch,
        session.reseed,
        lambda: session.apply_page(page_of([])),
        session.knows_relay_state,
        session.last_relay_state,
        session.count_dirty,
    ):
        with pytest.raises(ReplicaClosedError):
            call()


def test_a_merge_past_max_items_tells_the_app_and_drops_nothing(
    make_replica: ReplicaFactory,
) -> None:
    clock = FakeClock()
    a = make_replica("a", wall_clock_ms=clock)
    b = make_replica("b", wall_clock_ms=clock)
    for i in range(3):
        a.put("personas", f"a{i}", {})
        b.put("personas", f"b{i}", {})
    events: list[ChangeEvent] = []
    a.subscribe(events.append)
    apply(a, dirty_envelopes(b))
    over = [e for e in events if e.kind == "over_limit"]
    assert [(e.collection, e.reason) for e in over] == [("personas", "6 items, max_items 3")]
    assert len(a.scan("personas")) == 6


def test_unlock_merges_versions_held_for_a_collection_another_process_declared(
    tmp_path: Path, account: Account, make_replica: ReplicaFactory
) -> None:
    narrow = Schema((Collection("threads"),))
    path = tmp_path / "shared.db"
    first = Replica.join(path, account.bundle, schema=narrow)
    first.unlock_with_key(account.key)
    second = Replica.open(path)
    second.unlock_with_key(account.key)
    first.declare(SCHEMA)  # the other process learns of "notes"
    writer = make_replica("w")
    writer.put("notes", "n", {"v": 1})
    apply(second, dirty_envelopes(writer))  # second still has the narrow schema
    assert second.status().held_other == {"collection": 1}
    second.lock()
    second.unlock_with_key(account.key)  # reloads the schema and re-examines the hold
    got = second.get("notes", "n")
    assert got is not None and got.document == {"v": 1}
    first.close()
    second.close()


def test_update_inside_a_batch_does_not_deadlock_with_another_threads_update(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica(freshness_window_s=0)
    in_change = threading.Event()
    release = threading.Event()

    def slow(doc: object) -> dict[str, int]:
        in_change.set()
        release.wait(5)
        return {"n": 1}

    other = threading.Thread(target=lambda: replica.update("notes", "c", slow), daemon=True)
    other.start()
    assert in_change.wait(5)
    done = threading.Event()

    def batch_update() -> None:
        with replica.batch():
            replica.update("notes", "c", lambda doc: {"n": 2})
        done.set()

    mine = threading.Thread(target=batch_update, daemon=True)
    mine.start()
    release.set()
    mine.join(10)
    other.join(10)
    assert done.is_set() and not other.is_alive()
    got = replica.get("notes", "c")
    assert got is not None and got.document in ({"n": 1}, {"n": 2})
