"""What only the PostgreSQL backend must do: several relay processes on one database. Pushes of
one account wait for each other and no other account; pulls never see a gap; a push through one
process is heard by every other (the shared behaviour is in test_storage.py)."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import TupleRow

from clients.cli import main
from relay.postgres import CHANNEL, PostgresStorage, postgres_statement
from relay.sqlpush import STORED_VERSIONS
from relay.storage import Device, TokenRecord, VersionRules
from replica.errors import InvalidArgumentError
from replica.wire import KdfParams, Page, PushBatch
from tests.conftest import FakeClock
from tests.relay.conftest import HLC, NOW_MS, envelope, fresh_schema, postgres_url, register
from tests.relay.server import RelayProcess

WAIT_S = 10.0
"""Bound on anything expected to happen: a hang fails the test instead of the whole run."""

MakeStorage = Callable[[], PostgresStorage]

HOLD_TOKEN_COMMITS = """
CREATE FUNCTION {schema}.hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_advisory_xact_lock_shared({key}); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER hold_commit AFTER INSERT ON {schema}.tokens
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {schema}.hold_commit();
"""
"""A transaction that inserted a token waits at its commit while the test holds `key`."""


@pytest.fixture
def schema() -> Iterator[str]:
    postgres_url()
    with fresh_schema() as name:
        yield name


@pytest.fixture
def make_storage(schema: str) -> Iterator[MakeStorage]:
    """Storages on one shared schema, as relay processes on one database would be."""
    made: list[PostgresStorage] = []

    def make() -> PostgresStorage:
        rules = VersionRules(FakeClock(NOW_MS), 5 * 60_000, 1000, accept_unsigned_pushes=True)
        made.append(PostgresStorage(postgres_url(), rules, schema=schema))
        return made[-1]

    yield make
    for storage in made:
        storage.close()


class Heard:
    """A head listener that records what it hears and lets a test wait for it."""

    def __init__(self) -> None:
        self.heads: list[tuple[str, int]] = []
        self._changed = threading.Condition()

    def __call__(self, account: str, head: int) -> None:
        with self._changed:
            self.heads.append((account, head))
            self._changed.notify_all()

    def wait_for(self, count: int) -> list[tuple[str, int]]:
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.heads) >= count, WAIT_S)
            return list(self.heads)


def one(i: int, key: bytes = b"k" * 16) -> PushBatch:
    """A version no other version dominates: node `i` with a vector of its own dot only."""
    return PushBatch([envelope(key, i, HLC + i, {i: HLC + i})])


def assert_gapless(page: Page) -> None:
    """Without compaction every seq up to the head is stored: a page is consecutive from its
    cursor and, when it is the last, reaches the head it reports."""
    seqs = [e.seq for e in page.entries]
    assert seqs == list(range(page.cursor + 1, page.cursor + 1 + len(seqs)))
    if not page.has_more:
        assert page.next_cursor == page.state.head == (seqs[-1] if seqs else page.cursor)


def test_two_processes_starting_at_once_share_one_storage_id(make_storage: MakeStorage) -> None:
    with ThreadPoolExecutor(4) as pool:
        storages = list(pool.map(lambda _: make_storage(), range(4)))
    assert len({s.storage_id for s in storages}) == 1
    assert len({s.secret for s in storages}) == 1


def test_a_push_waits_for_the_account_lock_and_blocks_no_other_account(
    make_storage: MakeStorage, schema: str
) -> None:
    storage = make_storage()
    register(storage, "a")
    register(storage, "b", "d2")
    storage.push("a", PushBatch([*one(1).envelopes, *one(2).envelopes]))
    lock = sql.SQL("SELECT id FROM {}.accounts WHERE name = 'a' FOR UPDATE").format(
        sql.Identifier(schema)
    )
    with psycopg.connect(postgres_url()) as holder, ThreadPoolExecutor(2) as pool:
        holder.execute(lock)  # in a transaction left open: what a push in progress holds
        waiting = pool.submit(storage.push, "a", one(3))
        with pytest.raises(TimeoutError):
            waiting.result(timeout=0.5)
        other = pool.submit(storage.push, "b", one(4)).result(timeout=WAIT_S)
        assert other.receipts[0].seq == 1
        page = storage.pull("a", 0)
        assert_gapless(page)
        assert page.state.head == 2 and not waiting.done()
        holder.rollback()
        assert waiting.result(timeout=WAIT_S).receipts[0].seq == 3
    assert [e.seq for e in storage.pull("a", 0).entries] == [1, 2, 3]


def test_a_push_through_one_process_is_heard_by_the_others(make_storage: MakeStorage) -> None:
    first, second = make_storage(), make_storage()
    register(first, "a")
    heard_first, heard_second = Heard(), Heard()
    first.listen(heard_first)
    second.listen(heard_second)
    first.push("a", one(1))
    assert heard_second.wait_for(1) == [("a", 1)]
    second.push("a", one(2))
    # NOTIFY arrives in commit order: once `first` hears head 2 through the database, an echo
    # of its own push (head 1, heard at once) would have arrived before it
    assert heard_first.wait_for(2) == [("a", 1), ("a", 2)]
    assert heard_second.wait_for(2) == [("a", 1), ("a", 2)]
    first.close()
    assert "sealsync-pg-listen" in {t.name for t in threading.enumerate()}  # second's
    second.close()
    assert "sealsync-pg-listen" not in {t.name for t in threading.enumerate()}


def test_a_listener_hears_nothing_from_another_schema(make_storage: MakeStorage) -> None:
    storage, peer = make_storage(), make_storage()
    register(storage, "a")
    heard = Heard()
    storage.listen(heard)
    with fresh_schema() as other:
        rules = VersionRules(FakeClock(NOW_MS), accept_unsigned_pushes=True)
        elsewhere = PostgresStorage(postgres_url(), rules, schema=other)
        register(elsewhere, "a")
        elsewhere.push("a", one(1))
        elsewhere.close()
    peer.push("a", PushBatch([one(1).envelopes[0], one(2).envelopes[0]]))
    assert heard.wait_for(1) == [("a", 2)]  # the other schema's head 1 would have come first


def test_concurrent_pushes_from_two_processes_get_consecutive_seqs_and_pulls_see_no_gap(
    make_storage: MakeStorage,
) -> None:
    storages = [make_storage(), make_storage()]
    register(storages[0], "a")
    writers, pushes = 6, 25
    keys = [bytes([k]) * 16 for k in range(3)]  # every writer writes the same few keys
    done = threading.Event()

    def write(w: int) -> list[int]:
        storage = storages[w % 2]
        seqs: list[int] = []
        for i in range(pushes):
            node = w * 1000 + i + 1
            batch = PushBatch([one(node, key).envelopes[0] for key in keys])
            seqs += [r.seq for r in storage.push("a", batch).receipts if r.seq is not None]
        return seqs

    def read() -> int:
        pages, cursor = 0, 0
        while pages == 0 or not done.is_set():
            page = storages[pages % 2].pull("a", cursor)
            assert_gapless(page)
            cursor, pages = page.next_cursor, pages + 1
        return pages

    with ThreadPoolExecutor(writers + 1) as pool:
        reader = pool.submit(read)
        results = [pool.submit(write, w) for w in range(writers)]
        try:
            seqs = [seq for result in results for seq in result.result(timeout=60)]
        finally:
            done.set()  # a failed writer must not leave the reader running
        reader.result(timeout=WAIT_S)
    total = writers * pushes * len(keys)
    assert sorted(seqs) == list(range(1, total + 1))
    final = storages[1].pull("a", 0)
    assert final.state.head == total and storages[0].stored_versions("a") == total


def blocked_by(db: psycopg.Connection[TupleRow], pid: int) -> int:
    """The one backend waiting for `pid` (a lock it holds), once there is one."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        row = db.execute(
            "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (pid,)
        ).fetchone()
        if row is not None:
            return int(row[0])
        time.sleep(0.01)
    raise TimeoutError(f"nothing waits for backend {pid}")


def test_a_device_revoked_while_its_refresh_commits_keeps_no_token(
    make_storage: MakeStorage, schema: str
) -> None:
    """Under READ COMMITTED a DELETE of the device's tokens would miss the successors of a
    refresh committing meanwhile: the revoked device would keep a working token chain."""
    storage = make_storage()
    register(storage, "a")
    refresh = TokenRecord(b"r" * 32, "a", "d2", "refresh", NOW_MS + 1)
    storage.add_device("a", Device("d2", "phone", NOW_MS), [refresh])
    successor = TokenRecord(b"s" * 32, "a", "d2", "refresh", NOW_MS + 2)
    key = secrets.randbelow(1 << 62)
    with psycopg.connect(postgres_url(), autocommit=True) as holder, ThreadPoolExecutor(2) as pool:
        holder.execute(sql.SQL(HOLD_TOKEN_COMMITS).format(schema=sql.Identifier(schema), key=key))
        holder.execute("SELECT pg_advisory_lock(%s)", (key,))
        refreshing = pool.submit(storage.replace_token, refresh.hash, [successor], NOW_MS + 300)
        refresh_pid = blocked_by(holder, holder.info.backend_pid)  # inserted, not committed
        revoking = pool.submit(storage.revoke_device, "a", "d2")
        blocked_by(holder, refresh_pid)  # the revoke waits for the refresh
        holder.execute("SELECT pg_advisory_unlock(%s)", (key,))
        assert refreshing.result(timeout=WAIT_S) and revoking.result(timeout=WAIT_S)
    assert storage.token(successor.hash) is None
    assert not storage.replace_token(successor.hash, [refresh], NOW_MS + 300)
    assert storage.devices("a") == [Device("d1", "laptop", NOW_MS)]


def test_a_passphrase_change_ending_other_sessions_ends_a_refresh_committing_meanwhile(
    make_storage: MakeStorage, schema: str
) -> None:
    """`passwd --end-other-sessions`: the DELETE of the other devices' tokens waits for a
    refresh in flight and then sees its successor, instead of missing it under READ
    COMMITTED (the other device would keep a working session)."""
    storage = make_storage()
    register(storage, "a")
    refresh = TokenRecord(b"r" * 32, "a", "d2", "refresh", NOW_MS + 1)
    storage.add_device("a", Device("d2", "phone", NOW_MS), [refresh])
    successor = TokenRecord(b"s" * 32, "a", "d2", "refresh", NOW_MS + 2)
    kdf = KdfParams(b"t" * 16)
    key = secrets.randbelow(1 << 62)
    with psycopg.connect(postgres_url(), autocommit=True) as holder, ThreadPoolExecutor(2) as pool:
        holder.execute(sql.SQL(HOLD_TOKEN_COMMITS).format(schema=sql.Identifier(schema), key=key))
        holder.execute("SELECT pg_advisory_lock(%s)", (key,))
        refreshing = pool.submit(storage.replace_token, refresh.hash, [successor], NOW_MS + 300)
        refresh_pid = blocked_by(holder, holder.info.backend_pid)  # inserted, not committed
        changing = pool.submit(
            storage.put_key_bundle, "a", 1, b"new", kdf, b"h" * 32, only_device="d1"
        )
        blocked_by(holder, refresh_pid)  # the change waits for the refresh
        holder.execute("SELECT pg_advisory_unlock(%s)", (key,))
        assert refreshing.result(timeout=WAIT_S) and changing.result(timeout=WAIT_S) == 2
    assert storage.token(successor.hash) is None
    assert storage.token(hashlib.sha256(b"a/d1").digest()) is not None  # this device's stays
    assert [d.id for d in storage.devices("a")] == ["d1", "d2"]  # listed, logged out


HOLD_TOKEN_INSERTS = """
CREATE FUNCTION {schema}.hold_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_advisory_xact_lock_shared({key}); RETURN NEW; END $$;
CREATE TRIGGER hold_insert BEFORE INSERT ON {schema}.tokens
FOR EACH ROW EXECUTE FUNCTION {schema}.hold_insert();
"""
"""A transaction inserting a token waits before the insert while the test holds `key`."""


def token_pair(tag: bytes) -> list[TokenRecord]:
    return [
        TokenRecord(tag + b"a" * 31, "a", "d2", "access", NOW_MS + 10_000),
        TokenRecord(tag + b"r" * 31, "a", "d2", "refresh", NOW_MS + 10_000),
    ]


def test_a_replay_racing_the_devices_own_refresh_leaves_one_token_chain(
    make_storage: MakeStorage, schema: str
) -> None:
    """The device refreshes with its successor while a spent token is replayed: whichever
    goes second must see the other's tokens, or both chains would stay live. The replay goes
    second here, out of turn (the successor was used): refused, and as a copy of a spent token
    is loose it ends the device's tokens, so no chain at all stays live."""
    storage = make_storage()
    register(storage, "a")
    spent = TokenRecord(b"o" * 32, "a", "d2", "refresh", NOW_MS + 10_000)
    storage.add_device("a", Device("d2", "phone", NOW_MS), [spent])
    first = token_pair(b"1")
    assert storage.replace_token(spent.hash, first, NOW_MS + 300)
    key = secrets.randbelow(1 << 62)
    with psycopg.connect(postgres_url(), autocommit=True) as holder, ThreadPoolExecutor(2) as pool:
        holder.execute(sql.SQL(HOLD_TOKEN_COMMITS).format(schema=sql.Identifier(schema), key=key))
        holder.execute("SELECT pg_advisory_lock(%s)", (key,))
        own = pool.submit(storage.replace_token, first[1].hash, token_pair(b"2"), NOW_MS + 300)
        own_pid = blocked_by(holder, holder.info.backend_pid)  # inserted, not committed
        replay = pool.submit(storage.replace_token, spent.hash, token_pair(b"9"), NOW_MS + 300)
        blocked_by(holder, own_pid)  # the replay waits for the device's refresh
        holder.execute("SELECT pg_advisory_unlock(%s)", (key,))
        assert own.result(timeout=WAIT_S) and not replay.result(timeout=WAIT_S)
    live = [t for t in token_pair(b"2") + token_pair(b"9") if storage.token(t.hash)]
    assert live == []


def test_a_refresh_and_a_revoke_of_one_device_take_turns_without_a_deadlock(
    make_storage: MakeStorage, schema: str
) -> None:
    storage = make_storage()
    register(storage, "a")
    refresh = TokenRecord(b"r" * 32, "a", "d2", "refresh", NOW_MS + 10_000)
    storage.add_device("a", Device("d2", "phone", NOW_MS), [refresh])
    key = secrets.randbelow(1 << 62)
    with psycopg.connect(postgres_url(), autocommit=True) as holder, ThreadPoolExecutor(2) as pool:
        holder.execute(sql.SQL(HOLD_TOKEN_INSERTS).format(schema=sql.Identifier(schema), key=key))
        holder.execute("SELECT pg_advisory_lock(%s)", (key,))
        refreshing = pool.submit(storage.replace_token, refresh.hash, token_pair(b"n"), NOW_MS + 1)
        refresh_pid = blocked_by(holder, holder.info.backend_pid)  # about to insert
        revoking = pool.submit(storage.revoke_device, "a", "d2")
        blocked_by(holder, refresh_pid)
        holder.execute("SELECT pg_advisory_unlock(%s)", (key,))
        assert refreshing.result(timeout=WAIT_S) and revoking.result(timeout=WAIT_S)
    assert [storage.token(t.hash) for t in (refresh, *token_pair(b"n"))] == [None, None, None]


def test_commits_are_synchronous_whatever_the_url_or_the_server_says(schema: str) -> None:
    url = make_conninfo(postgres_url(), options="-c synchronous_commit=off")
    storage = PostgresStorage(url, VersionRules(FakeClock(NOW_MS)), schema=schema)
    try:
        with storage._pool.connection() as db:
            assert db.execute("SHOW synchronous_commit").fetchone() == ("on",)
    finally:
        storage.close()


def test_a_malformed_notification_is_skipped_and_listening_goes_on(
    make_storage: MakeStorage, schema: str
) -> None:
    storage, peer = make_storage(), make_storage()
    register(storage, "a")
    heard = Heard()
    storage.listen(heard)
    wrong_types = {"schema": schema, "origin": "elsewhere", "account": 1, "head": "2"}
    with psycopg.connect(postgres_url(), autocommit=True) as db:
        for payload in (
            "not json",
            "[1]",
            '{"schema": "x"}',
            msgspec.json.encode(wrong_types).decode(),
        ):
            db.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
    peer.push("a", one(1))
    assert heard.wait_for(1) == [("a", 1)]


def test_connections_the_server_dropped_cost_no_request(make_storage: MakeStorage) -> None:
    """As after a database restart: every pooled connection is gone, and the next calls
    still succeed (each connection is checked before it is handed out)."""
    storage = make_storage()
    register(storage, "a")
    size = storage._pool.get_stats()["pool_size"]
    with ExitStack() as taken:
        pids = [
            taken.enter_context(storage._pool.connection()).info.backend_pid for _ in range(size)
        ]
    with psycopg.connect(postgres_url(), autocommit=True) as db:
        db.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
        while db.execute("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchone():
            time.sleep(0.01)
    for _ in range(size + 1):
        assert storage.state("a").head == 0


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("postgresql://sealsync:s3cret-pw@127.0.0.1:1/relaydb", "127.0.0.1:1/relaydb"),
        ("postgresql://sealsync:s3cret-pw@[::1", "malformed"),
    ],
)
def test_a_storage_that_cannot_open_names_the_server_but_never_the_password(
    url: str, named: str
) -> None:
    with pytest.raises(InvalidArgumentError) as refused:
        PostgresStorage(url, VersionRules(FakeClock(NOW_MS)))
    assert named in str(refused.value) and "s3cret-pw" not in str(refused.value)
    assert refused.value.hint


def json_log(path: Path) -> list[dict[str, Any]]:
    """The relay's log lines that are JSON (a line outside the logger tree is plain text)."""
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return entries


@pytest.mark.slow
def test_a_relay_logs_its_listen_connection_lost_and_restored_as_json(tmp_path: Path) -> None:
    """`relay serve` logs JSON lines for the whole `sealsync.` tree: a LISTEN connection cut
    on the server shows as a warning and its reconnection as info, both from
    `sealsync.relay.postgres` (a logger named `relay.postgres` printed the first as plain
    text and lost the second)."""
    log_path = tmp_path / "relay.log"
    with fresh_schema() as schema:
        options = ("--database-url", postgres_url(), "--schema", schema)
        with (
            RelayProcess(None, log_path, *options, accept_unsigned=True),
            psycopg.connect(postgres_url()) as db,
        ):
            db.autocommit = True
            find = "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
            deadline = time.monotonic() + WAIT_S
            while not (row := db.execute(find, (f"sealsync-listen-{schema}",)).fetchone()):
                assert time.monotonic() < deadline, "no LISTEN connection"
                time.sleep(0.05)
            db.execute("SELECT pg_terminate_backend(%s)", row)
            while not any("restored" in e["message"] for e in json_log(log_path)):
                assert time.monotonic() < deadline + WAIT_S, log_path.read_text()[-2000:]
                time.sleep(0.05)
    mine = [e for e in json_log(log_path) if e["logger"] == "sealsync.relay.postgres"]
    assert [(e["level"], e["message"].split(" for ")[0]) for e in mine] == [
        ("warning", "LISTEN connection"),
        ("info", "LISTEN connection"),
    ]
    assert "lost" in mine[0]["message"] and "restored" in mine[1]["message"]
    assert all(schema in e["message"] for e in mine)


def test_a_pushs_lookup_of_stored_versions_searches_the_key_index_in_any_plan(
    schema: str, make_storage: MakeStorage
) -> None:
    """psycopg prepares a statement it has run five times, and PostgreSQL may then plan it once
    for any parameters, before the table has statistics (a relay under load, autovacuum not
    there yet): the lookup of a batch's stored versions must still search the (account, key)
    index by key. Written as a long `key IN ($2, …)` it was planned as a scan of the account's
    every version, key as a filter (measured: pushes of 4000 envelopes went from 0.05 s to
    2.7 s at 48k versions)."""
    storage = make_storage()
    register(storage, "a")
    numbers = iter(range(1, 100))
    lookup = re.sub("%s", lambda _: f"${next(numbers)}", postgres_statement(STORED_VERSIONS))
    with psycopg.connect(make_conninfo(postgres_url(), options=f"-c search_path={schema}")) as db:
        db.autocommit = True
        db.execute("ALTER TABLE versions SET (autovacuum_enabled = false)")
        db.execute(
            "INSERT INTO versions (account, seq, key, node, hlc, vector, digest, envelope)"
            " SELECT a.id, g, substr(sha256(int8send(g)), 1, 16), 1, g, '', '', ''"
            " FROM accounts a, generate_series(1, 30000) g WHERE a.name = 'a'"
        )
        db.execute("SET plan_cache_mode = force_generic_plan")
        db.execute(sql.SQL("PREPARE lookup AS {}").format(sql.SQL(lookup)))
        plan = [row[0] for row in db.execute("EXPLAIN EXECUTE lookup(1, ARRAY[''::bytea])")]
    searched = [line for line in plan if "Index Cond" in line]
    assert any("key = ANY" in line for line in searched), "\n".join(plan)


def test_relay_compact_says_postgresql_keeps_freed_space_itself() -> None:
    """`sealsync relay compact` rewrites a SQLite file; on PostgreSQL it changes nothing and
    says what does (tests/clients/test_collection_space.py compacts a SQLite relay)."""
    with fresh_schema() as schema:
        args = ["relay", "compact", "--database-url", postgres_url(), "--schema", schema]
        result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert "PostgreSQL reuses freed space itself" in result.output
    assert "VACUUM FULL" in result.output
