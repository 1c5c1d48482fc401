"""The replica's benchmarks: local writes and merges, each against a raw baseline."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgspec
import raw  # noqa: F401  (registers the baselines these benchmarks name)
from harness import (
    COLLECTION,
    DOCUMENT_BYTES,
    PAGE_ENTRIES,
    Bench,
    BenchmarkError,
    Line,
    benchmark,
    best_seconds,
    check_equal,
)

from replica import (
    Applied,
    Collection,
    Page,
    PageEntry,
    RelayState,
    Replica,
    ReplicaOptions,
    Schema,
)
from replica.wire import parse_header

# ---- the replica ----------------------------------------------------------------------------


DOCUMENT_TEXT_CHARS = 456
"""Makes `document` ~500 bytes of MessagePack (DOCUMENT_BYTES), sealed into ~660 bytes."""
MERGE_TEXT_CHARS = 316
"""Makes the sealed envelope DOCUMENT_BYTES (500) long, as raw.upsert_aead's are: the issue
compares replica.merge with that baseline at one envelope size (checked in make_merge_data)."""


def document(i: int, version: int = 1, text_chars: int = DOCUMENT_TEXT_CHARS) -> dict[str, Any]:
    """A document like a chat message; ~500 bytes of MessagePack with the default text."""
    return {"thread": f"thread-{i % 97:04d}", "version": version, "text": "x" * text_chars, "n": i}


def record_id(i: int) -> str:
    return f"note-{i:07d}"


def put_in_batches(
    replica: Replica,
    ids: range,
    batch: int,
    version: int = 1,
    text_chars: int = DOCUMENT_TEXT_CHARS,
) -> None:
    """Put `ids` in transactions of `batch` puts each."""
    for start in range(ids.start, ids.stop, batch):
        with replica.batch():
            for i in range(start, min(start + batch, ids.stop)):
                replica.put(COLLECTION, record_id(i), document(i, version, text_chars))


def count_versions(path: Path) -> int:
    """Rows of a replica's versions table, read through a connection of our own."""
    db = sqlite3.connect(path)
    try:
        return int(db.execute("SELECT count(*) FROM versions").fetchone()[0])
    finally:
        db.close()


def close_and_count(replica: Replica, path: Path, expected: int, what: str) -> None:
    replica.close()
    check_equal(what, count_versions(path), expected)


@benchmark("replica.put", needs=("raw.sqlite_upsert",))
def bench_replica_put(bench: Bench) -> list[Line]:
    """Replica.put of new records, `put_batch` puts per `replica.batch()` transaction.

    Default options (the freshness window on), as an app writes.
    """
    n, batch = bench.sizes.puts, bench.sizes.put_batch

    seconds = best_seconds(
        bench,
        bench.sizes.repeats,
        lambda: bench.replica("put"),
        lambda state: put_in_batches(state[0], range(n), batch),
        lambda state: close_and_count(*state, n, "replica.put rows"),
    )
    return [
        Line("replica.put", n / seconds, "ops/s", "raw.sqlite_upsert", {"n": n, "batch": batch})
    ]


def put_each(replica: Replica, numbers: range) -> None:
    """Replica.put of records `numbers`, one transaction each."""
    for i in numbers:
        replica.put(COLLECTION, record_id(i), document(i))


@benchmark("replica.put_single", needs=("raw.sqlite_upsert",))
def bench_replica_put_single(bench: Bench) -> list[Line]:
    """Replica.put with one transaction (and one fsync) per put."""
    n = bench.sizes.single_puts

    seconds = best_seconds(
        bench,
        bench.sizes.repeats,
        lambda: bench.replica("put-single"),
        lambda state: put_each(state[0], range(n)),
        lambda state: close_and_count(*state, n, "replica.put_single rows"),
    )
    return [
        Line("replica.put_single", n / seconds, "ops/s", "raw.sqlite_upsert", {"n": n, "batch": 1})
    ]


# ---- replica.merge --------------------------------------------------------------------------

MERGE_OPTIONS = ReplicaOptions(freshness_window_s=0)


@dataclass(frozen=True)
class MergeData:
    """v1 and v2 envelopes of every record (v2 dominates v1), in one order of the keys."""

    v1: list[bytes]
    v2: list[bytes]

    def initial(self) -> list[bytes]:
        """What the target holds before the timed run: v2 of even records, v1 of odd ones."""
        return [self.v2[i] if i % 2 == 0 else self.v1[i] for i in range(len(self.v1))]

    def inbound(self) -> list[bytes]:
        """The timed run: v1 of even records (dominated), v2 of odd ones (dominating)."""
        return [self.v1[i] if i % 2 == 0 else self.v2[i] for i in range(len(self.v1))]


def envelopes_by_key(path: Path) -> dict[bytes, bytes]:
    db = sqlite3.connect(path)
    try:
        return dict(db.execute("SELECT key, envelope FROM versions").fetchall())
    finally:
        db.close()


def make_merge_data(bench: Bench, n: int) -> MergeData:
    """A writer puts v1 of every record, then v2 over it; envelopes are read from its file.
    Every envelope is DOCUMENT_BYTES long, the size of the baseline's (MERGE_TEXT_CHARS)."""
    options = ReplicaOptions(freshness_window_s=0, synchronous="normal")
    writer, path = bench.replica("writer", options)
    batch = bench.sizes.put_batch
    put_in_batches(writer, range(n), batch, version=1, text_chars=MERGE_TEXT_CHARS)
    v1 = envelopes_by_key(path)
    put_in_batches(writer, range(n), batch, version=2, text_chars=MERGE_TEXT_CHARS)
    v2 = envelopes_by_key(path)
    writer.close()
    check_equal("replica.merge records written", (len(v1), len(v2)), (n, n))
    sizes = {len(envelope) for envelope in [*v1.values(), *v2.values()]}
    check_equal("replica.merge envelope bytes", sizes, {DOCUMENT_BYTES})
    keys = sorted(v1)
    return MergeData([v1[k] for k in keys], [v2[k] for k in keys])


def pages_of(envelopes: Sequence[bytes], first_seq: int, head: int) -> list[Page]:
    """Consecutive pages of PAGE_ENTRIES entries, seqs from `first_seq`, as a relay serves."""
    state = RelayState("bench-storage", "bench-epoch", head)
    pages = []
    for start in range(0, len(envelopes), PAGE_ENTRIES):
        chunk = envelopes[start : start + PAGE_ENTRIES]
        seq = first_seq + start
        entries = [PageEntry(seq + j, e) for j, e in enumerate(chunk)]
        more = start + PAGE_ENTRIES < len(envelopes)
        pages.append(Page(seq - 1, entries, seq + len(chunk) - 1, more, state))
    return pages


def apply_pages(replica: Replica, pages: Sequence[Page]) -> list[Applied]:
    session = replica.sync_session()
    return [session.apply_page(page) for page in pages]


def make_merge_target(bench: Bench, data: MergeData, schema: Schema | None = None) -> Path:
    """A closed replica file holding the initial half-v1, half-v2 state (WAL checkpointed),
    under `schema` if given (declared before the records merge)."""
    n = len(data.v1)
    target, path = bench.replica(
        "merge-target" if schema is None else "merge-target-x", MERGE_OPTIONS
    )
    if schema is not None:
        target.declare(schema)
    applied = apply_pages(target, pages_of(data.initial(), 1, 2 * n))
    target.close()
    check_equal("replica.merge initial versions merged", sum(a.merged for a in applied), n)
    check_equal("replica.merge initial rows", count_versions(path), n)
    return path


def open_copy(bench: Bench, template: Path) -> tuple[Replica, Path]:
    """A fresh copy of the target for one repeat, so every repeat starts from one state."""
    path = bench.path("merge-run")
    shutil.copyfile(template, path)
    replica = Replica.open(path, options=MERGE_OPTIONS)
    replica.unlock_with_key(bench.account().key)
    return replica, path


def verify_merge(replica: Replica, path: Path, applied: list[Applied], data: MergeData) -> None:
    """Every record must now hold exactly its v2, and the results must say why."""
    n = len(data.v1)
    replica.close()
    check_equal("replica.merge dominating merged", sum(a.merged for a in applied), n // 2)
    check_equal(
        "replica.merge dominated superseded", sum(a.superseded for a in applied), (n + 1) // 2
    )
    check_equal("replica.merge held", sum(sum(a.held.values()) for a in applied), 0)
    expected = set()
    for envelope in data.v2:
        header = parse_header(envelope)
        expected.add((header.key, header.node, header.hlc))
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT key, node, hlc FROM versions").fetchall()
        stored = {(key, node % (1 << 64), hlc) for key, node, hlc in rows}  # signed in SQL
    finally:
        db.close()
    check_equal("replica.merge rows", len(stored), n)
    if stored != expected:
        raise BenchmarkError(f"replica.merge: {len(stored - expected)} records do not hold v2")


@benchmark("replica.merge", needs=("raw.upsert_aead",))
def bench_replica_merge(bench: Bench) -> list[Line]:
    """N inbound versions through `SyncSession.apply_page` into a replica holding N records.

    Half dominate the stored version and replace it, half are dominated and dropped; none is
    concurrent. Envelopes are as long as the baseline's. Pages of PAGE_ENTRIES, each its own
    transaction, as a sync driver applies them (the relay's default page of 4000 entries
    merged no faster when measured).
    """
    n = bench.sizes.merge_rows
    data = bench.memo("merge_data", lambda: make_merge_data(bench, n))
    seconds = timed_merge(bench, data, make_merge_target(bench, data))
    extra = {
        "n": n,
        "page": PAGE_ENTRIES,
        "dominating": n // 2,
        "envelope_bytes": len(data.v1[0]),
        "document_bytes": len(msgspec.msgpack.encode(document(0, text_chars=MERGE_TEXT_CHARS))),
    }
    return [Line("replica.merge", n / seconds, "rows/s", "raw.upsert_aead", extra)]


def timed_merge(bench: Bench, data: MergeData, template: Path) -> float:
    """The best time of replica.merge's run into copies of `template`."""
    n = len(data.v1)
    pages = pages_of(data.inbound(), n + 1, 2 * n)
    results: list[Applied] = []

    def run(state: tuple[Replica, Path]) -> None:
        results[:] = apply_pages(state[0], pages)

    return best_seconds(
        bench,
        bench.sizes.merge_repeats,
        lambda: open_copy(bench, template),
        run,
        lambda state: verify_merge(*state, results, data),
    )


INDEXED_SCHEMA = Schema((Collection(COLLECTION, "lww", index="thread", created_field="n"),))


@benchmark("replica.merge_indexed", needs=("replica.merge",))
def bench_replica_merge_indexed(bench: Bench) -> list[Line]:
    """replica.merge into a replica whose collection declares a blind index on the documents'
    `thread` (97 threads), against replica.merge of the same run: what keeping the index
    in the merge's statements costs (issue 13 asks ≥ 0.8)."""
    n = bench.sizes.merge_rows
    data = bench.memo("merge_data", lambda: make_merge_data(bench, n))
    template = make_merge_target(bench, data, INDEXED_SCHEMA)
    db = sqlite3.connect(template)
    try:
        indexed = db.execute("SELECT count(*) FROM versions WHERE blind IS NOT NULL").fetchone()
    finally:
        db.close()
    check_equal("replica.merge_indexed initial index entries", indexed[0], n)
    seconds = timed_merge(bench, data, template)
    extra = {"n": n, "threads": 97, "page": PAGE_ENTRIES}
    return [Line("replica.merge_indexed", n / seconds, "rows/s", "replica.merge", extra)]


def target_holding(bench: Bench, name: str, envelopes: list[bytes]) -> Path:
    """A closed replica file holding `envelopes` (one version of each record)."""
    target, path = bench.replica(name, MERGE_OPTIONS)
    apply_pages(target, pages_of(envelopes, 1, 2 * len(envelopes)))
    target.close()
    check_equal(f"{name} rows", count_versions(path), len(envelopes))
    return path


def merge_path_line(bench: Bench, name: str, held: list[bytes], inbound: list[bytes]) -> Line:
    """Rows/s of one merge path alone: every inbound version is dropped as covered
    (`dominated`), or every one replaces the stored version in place (`dominating`)."""
    n = len(inbound)
    template = target_holding(bench, f"{name}-target", held)
    pages = pages_of(inbound, n + 1, 2 * n)
    results: list[Applied] = []
    covered = name.endswith("dominated")

    def run(state: tuple[Replica, Path]) -> None:
        results[:] = apply_pages(state[0], pages)

    def verify(state: tuple[Replica, Path]) -> None:
        state[0].close()
        got = sum(a.superseded if covered else a.merged for a in results)
        check_equal(f"{name} {'superseded' if covered else 'merged'}", got, n)

    seconds = best_seconds(
        bench, bench.sizes.merge_repeats, lambda: open_copy(bench, template), run, verify
    )
    return Line(name, n / seconds, "rows/s", "raw.upsert_aead", {"n": n})


@benchmark("replica.merge_paths", needs=("raw.upsert_aead",))
def bench_replica_merge_paths(bench: Bench) -> list[Line]:
    """The two halves of replica.merge, measured apart: where the time goes."""
    n = bench.sizes.merge_rows
    data = bench.memo("merge_data", lambda: make_merge_data(bench, n))
    return [
        merge_path_line(bench, "replica.merge_paths.dominated", data.v2, data.v1),
        merge_path_line(bench, "replica.merge_paths.dominating", data.v1, data.v2),
    ]


def prepare_local_writes(bench: Bench, count: int, window_s: float) -> tuple[Replica, Path]:
    """A replica that just wrote `count` records of its own, each locked for `window_s`."""
    replica, path = bench.replica("merge-locks", ReplicaOptions(freshness_window_s=window_s))
    for start in range(0, count, bench.sizes.put_batch):
        with replica.batch():
            for i in range(start, min(start + bench.sizes.put_batch, count)):
                replica.put(COLLECTION, f"local-{i:07d}", {"n": i})
    return replica, path


def verify_new_merged(replica: Replica, path: Path, applied: list[Applied], count: int) -> None:
    replica.close()
    check_equal("replica.merge_locks merged", sum(a.merged for a in applied), count)
    check_equal("replica.merge_locks rows", count_versions(path), 2 * count)


def merge_new_line(bench: Bench, name: str, window_s: float, data: MergeData) -> Line:
    """Rows/s of merging records new to a replica that wrote as many records of its own."""
    count = min(bench.sizes.fresh_locks, len(data.v1))
    pages = pages_of(data.v1[:count], 1, count)
    results: list[Applied] = []

    def run(state: tuple[Replica, Path]) -> None:
        results[:] = apply_pages(state[0], pages)

    seconds = best_seconds(
        bench,
        bench.sizes.merge_repeats,
        lambda: prepare_local_writes(bench, count, window_s),
        run,
        lambda state: verify_new_merged(*state, results, count),
    )
    return Line(name, count / seconds, "rows/s", extra={"n": count, "local_records": count})


@benchmark("replica.merge_locks")
def bench_replica_merge_locks(bench: Bench) -> list[Line]:
    """Merging while the replica's own recent writes hold freshness locks, against none.

    The inbound records are not the locked ones, so no lock should apply to them, and the
    ratio shows what merely having fresh locks costs a merge (ideally about 1).
    """
    n = bench.sizes.merge_rows
    data = bench.memo("merge_data", lambda: make_merge_data(bench, n))
    unlocked = merge_new_line(bench, "replica.merge_locks.none", 0, data)
    fresh = merge_new_line(bench, "replica.merge_locks.fresh", 3600, data)
    return [unlocked, replace(fresh, baseline=unlocked.name)]
