"""sealsync's one benchmark script: named benchmarks, each measured against a baseline.

    python bench/run.py [--quick] [--json] [--only PREFIX] [--n N] [--profile] [--dir DIR]

The machine is shared and noisy, so absolute figures mean little: each benchmark that has a
baseline names another line of the same run (`raw.*`: what plain sqlite3 and AES-GCM do with
no engine around them), and the figure to watch is the `ratio` of the two rates. Each line is
the best of a few repeats where a repeat is cheap.

A benchmark is a function registered with `@benchmark(name, needs=...)` that returns `Line`s;
`needs` names the benchmarks its baselines come from, so `--only replica.merge` also runs
`raw.upsert_aead`. Benchmarks check what they did (row counts, receipts) and raise
`BenchmarkError` otherwise: a benchmark that silently does nothing is worse than none.

`--profile` runs cProfile over the timed sections only and prints the top functions by
tottime to stderr (figures measured under the profiler are slower; compare ratios only
between runs without it).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/run.py` from a checkout, without installing
    sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402
from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: E402

from replica import (  # noqa: E402
    Applied,
    Collection,
    Page,
    PageEntry,
    RelayState,
    Replica,
    ReplicaOptions,
    Schema,
)
from replica.wire import parse_header  # noqa: E402

RATE_UNITS = frozenset({"rows/s", "ops/s"})
SCHEMA = Schema((Collection("notes", "lww"),))
COLLECTION = "notes"
PASSPHRASE = "benchmark passphrase, not a secret"
DOCUMENT_BYTES = 500
PAGE_ENTRIES = 1000
PROFILE_TOP = 15


class BenchmarkError(Exception):
    """A benchmark did not do what it measures (wrong row count, refused versions...)."""


# ---- results --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One measured figure; `baseline` names another line of the same run."""

    name: str
    value: float
    unit: str
    baseline: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def line_to_dict(line: Line, value_by_name: dict[str, float]) -> dict[str, Any]:
    """The JSON object of a line; `ratio` only when its baseline ran and both are rates."""
    out: dict[str, Any] = {"name": line.name, "value": line.value, "unit": line.unit}
    if line.baseline is not None:
        out["baseline"] = line.baseline
        base = value_by_name.get(line.baseline)
        if base and line.unit in RATE_UNITS:
            out["ratio"] = line.value / base
    out.update(line.extra)
    return out


def print_json(lines: Sequence[Line]) -> None:
    values = {line.name: line.value for line in lines}
    for line in lines:
        print(json.dumps(line_to_dict(line, values)))


def print_table(lines: Sequence[Line]) -> None:
    """A readable table: figure, unit, ratio to its baseline, then the line's extra fields."""
    values = {line.name: line.value for line in lines}
    print(f"{'benchmark':<32} {'value':>14} {'unit':<7} {'ratio':>7}  {'vs':<26} details")
    for line in lines:
        row = line_to_dict(line, values)
        ratio = f"{row['ratio']:.3f}" if "ratio" in row else ""
        details = " ".join(f"{k}={v}" for k, v in line.extra.items())
        print(
            f"{line.name:<32} {line.value:>14,.0f} {line.unit:<7} {ratio:>7}  "
            f"{line.baseline or '':<26} {details}"
        )


# ---- sizes, workspace and timing ------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """How much each benchmark does; `--quick` and `--n` pick smaller ones."""

    sqlite_rows: int
    aead_ops: int
    merge_rows: int  # raw.upsert_aead and replica.merge share it: their ratio needs one n
    fresh_locks: int  # replica.merge_locks: local records under a freshness lock, and merged
    puts: int
    put_batch: int
    single_puts: int
    repeats: int
    merge_repeats: int


FULL = Sizes(200_000, 200_000, 100_000, 5_000, 20_000, 1000, 1000, 5, 3)
QUICK = Sizes(50_000, 50_000, 20_000, 2_000, 5_000, 1000, 300, 3, 2)


def sizes_with_n(sizes: Sizes, n: int) -> Sizes:
    """Every count set to `n` (a tiny run for tests of this script); repeats kept."""
    return replace(
        sizes,
        sqlite_rows=n,
        aead_ops=n,
        merge_rows=n,
        fresh_locks=n,
        puts=n,
        put_batch=min(sizes.put_batch, n),
        single_puts=n,
    )


T = TypeVar("T")


@dataclass(frozen=True)
class Account:
    """A key bundle and raw key, so every replica after the first skips Argon2id."""

    bundle: bytes
    key: bytes


class Bench:
    """What a benchmark gets: sizes, a scratch folder, the shared account, and the timer."""

    def __init__(self, sizes: Sizes, folder: Path, profiler: cProfile.Profile | None) -> None:
        self.sizes = sizes
        self.folder = folder
        self._profiler = profiler
        self.profiling = False
        self._account: Account | None = None
        self._files = 0
        self._memo: dict[str, Any] = {}

    def path(self, stem: str) -> Path:
        """A fresh file name in the scratch folder."""
        self._files += 1
        return self.folder / f"{stem}-{self._files}.db"

    def account(self) -> Account:
        """Created once per run: Argon2id costs a quarter second and measures nothing here."""
        if self._account is None:
            replica, _ = Replica.create(self.path("account"), SCHEMA, PASSPHRASE)
            self._account = Account(replica.key_bundle(), replica.account_key())
            replica.close()
        return self._account

    def memo(self, name: str, make: Callable[[], T]) -> T:
        """Data built once per run and shared by the benchmarks that need it."""
        if name not in self._memo:
            self._memo[name] = make()
        value: T = self._memo[name]
        return value

    def replica(self, stem: str, options: ReplicaOptions | None = None) -> tuple[Replica, Path]:
        """A new unlocked replica of the shared account, and its file."""
        account = self.account()
        path = self.path(stem)
        replica = Replica.join(path, account.bundle, options=options)
        replica.unlock_with_key(account.key)
        return replica, path

    def seconds(self, run: Callable[[], object]) -> float:
        """Wall time of `run()`, under the profiler when `--profile` asked for this benchmark."""
        profiler = self._profiler if self.profiling else None
        if profiler is not None:
            profiler.enable()
        start = time.perf_counter()
        try:
            run()
        finally:
            elapsed = time.perf_counter() - start
            if profiler is not None:
                profiler.disable()
        return elapsed


def best_seconds(
    bench: Bench,
    repeats: int,
    prepare: Callable[[], T],
    run: Callable[[T], object],
    verify: Callable[[T], None],
) -> float:
    """The fastest of `repeats` runs; each gets fresh state from `prepare` and is verified."""
    best = float("inf")
    for _ in range(repeats):
        state = prepare()
        best = min(best, bench.seconds(partial(run, state)))
        verify(state)
    return best


# ---- registry -------------------------------------------------------------------------------

BenchmarkFunction = Callable[[Bench], list[Line]]


@dataclass(frozen=True)
class Benchmark:
    name: str
    function: BenchmarkFunction
    needs: tuple[str, ...]


REGISTRY: dict[str, Benchmark] = {}


def benchmark(
    name: str, *, needs: tuple[str, ...] = ()
) -> Callable[[BenchmarkFunction], BenchmarkFunction]:
    """Register a benchmark; `needs` are the benchmarks whose lines it uses as baselines."""

    def register(function: BenchmarkFunction) -> BenchmarkFunction:
        unknown = [n for n in needs if n not in REGISTRY]
        if name in REGISTRY or unknown:
            raise ValueError(f"benchmark {name!r}: duplicate, or needs unregistered {unknown}")
        REGISTRY[name] = Benchmark(name, function, needs)
        return function

    return register


def select(prefixes: Sequence[str]) -> list[Benchmark]:
    """Benchmarks whose name starts with a prefix, plus what they need, in registry order."""
    wanted = {name for name in REGISTRY if not prefixes or name.startswith(tuple(prefixes))}
    pending = list(wanted)
    while pending:
        for need in REGISTRY[pending.pop()].needs:
            if need not in wanted:
                wanted.add(need)
                pending.append(need)
    return [b for name, b in REGISTRY.items() if name in wanted]


# ---- plain sqlite3 and AES-GCM: the baselines -----------------------------------------------


def connect_wal(path: Path) -> sqlite3.Connection:
    """A connection set up as the replica's: WAL, synchronous=FULL, explicit transactions."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return db


def random_rows(n: int, value_bytes: int) -> list[tuple[bytes, bytes]]:
    return [(os.urandom(16), os.urandom(value_bytes)) for _ in range(n)]


KV_TABLE = "CREATE TABLE kv (key BLOB PRIMARY KEY, value BLOB NOT NULL)"


def sqlite_upsert_line(bench: Bench, name: str, create_table: str) -> Line:
    """Rows/s of one executemany upsert of N random-keyed rows into an empty table."""
    n = bench.sizes.sqlite_rows
    rows = random_rows(n, DOCUMENT_BYTES)

    def prepare() -> sqlite3.Connection:
        db = connect_wal(bench.path("sqlite-upsert"))
        db.execute(create_table)
        return db

    def run(db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "INSERT INTO kv (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            rows,
        )
        db.execute("COMMIT")

    def verify(db: sqlite3.Connection) -> None:
        check_equal(f"{name} rows", db.execute("SELECT count(*) FROM kv").fetchone()[0], n)
        db.close()

    seconds = best_seconds(bench, bench.sizes.repeats, prepare, run, verify)
    return Line(name, n / seconds, "rows/s", extra={"n": n})


@benchmark("raw.sqlite_upsert")
def bench_sqlite_upsert(bench: Bench) -> list[Line]:
    """What SQLite alone does: one executemany upsert of N ~500-byte rows, ordinary table."""
    return [sqlite_upsert_line(bench, "raw.sqlite_upsert", KV_TABLE)]


@benchmark("raw.sqlite_upsert_without_rowid", needs=("raw.sqlite_upsert",))
def bench_sqlite_upsert_without_rowid(bench: Bench) -> list[Line]:
    """The same into a WITHOUT ROWID table, as the replica's `versions` table is declared.

    SQLite advises WITHOUT ROWID only for rows under ~1/20 of a page; envelopes are larger,
    and random keys then split wide leaf pages. This line shows what that costs.
    """
    line = sqlite_upsert_line(bench, "raw.sqlite_upsert_without_rowid", KV_TABLE + " WITHOUT ROWID")
    return [replace(line, baseline="raw.sqlite_upsert")]


def seal_many(aead: AESGCM, plaintexts: Sequence[bytes], ad: bytes) -> list[bytes]:
    """nonce ‖ ciphertext ‖ tag for each plaintext, as an envelope carries them."""
    out = []
    for plaintext in plaintexts:
        nonce = os.urandom(12)
        out.append(nonce + aead.encrypt(nonce, plaintext, ad))
    return out


def open_all(aead: AESGCM, sealed: Sequence[bytes], ad: bytes) -> None:
    for data in sealed:
        aead.decrypt(data[:12], data[12:], ad)


@benchmark("raw.aesgcm_open")
def bench_aesgcm_open(bench: Bench) -> list[Line]:
    """What AES-256-GCM alone costs per ~500-byte ciphertext, Python call overhead included."""
    n = bench.sizes.aead_ops
    aead = AESGCM(AESGCM.generate_key(256))
    ad = os.urandom(72)  # an envelope header with one vector entry, plus the account id
    sealed = seal_many(aead, [os.urandom(DOCUMENT_BYTES - 28) for _ in range(n)], ad)
    seconds = best_seconds(
        bench, bench.sizes.repeats, lambda: None, lambda _: open_all(aead, sealed, ad), no_check
    )
    return [Line("raw.aesgcm_open", n / seconds, "ops/s", extra={"n": n, "bytes": len(sealed[0])})]


def no_check(_: object) -> None:
    """For runs whose effect is nothing but time."""


def check_equal(what: str, got: object, expected: object) -> None:
    if got != expected:
        raise BenchmarkError(f"{what}: got {got}, expected {expected}")


@dataclass(frozen=True)
class UpsertData:
    """Inbound envelopes and the older or newer versions already stored for their keys."""

    aead: AESGCM
    keys: list[bytes]
    inbound: list[bytes]
    stored_hlc: list[int]


INBOUND_HLC = 2000


def make_upsert_data(n: int) -> UpsertData:
    """Even keys hold an older version (1000), odd ones a newer one (3000): half win."""
    aead = AESGCM(AESGCM.generate_key(256))
    keys = [os.urandom(16) for _ in range(n)]
    inbound = [
        seal_many(aead, [os.urandom(DOCUMENT_BYTES - 28)], key + INBOUND_HLC.to_bytes(8, "big"))[0]
        for key in keys
    ]
    stored = [1000 if i % 2 == 0 else 3000 for i in range(n)]
    return UpsertData(aead, keys, inbound, stored)


def prepare_upsert_table(bench: Bench, data: UpsertData) -> sqlite3.Connection:
    db = connect_wal(bench.path("upsert-aead"))
    db.execute(
        "CREATE TABLE versions (key BLOB PRIMARY KEY, hlc INTEGER NOT NULL, envelope BLOB NOT NULL)"
    )
    db.execute("BEGIN IMMEDIATE")
    db.executemany(
        "INSERT INTO versions (key, hlc, envelope) VALUES (?, ?, ?)",
        [(k, h, e) for k, h, e in zip(data.keys, data.stored_hlc, data.inbound, strict=True)],
    )
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return db


def open_and_upsert(db: sqlite3.Connection, data: UpsertData) -> None:
    """Authenticate every envelope, then one upsert that keeps the newer version of each key."""
    rows = []
    decrypt = data.aead.decrypt
    for key, envelope in zip(data.keys, data.inbound, strict=True):
        decrypt(envelope[:12], envelope[12:], key + INBOUND_HLC.to_bytes(8, "big"))
        rows.append((key, INBOUND_HLC, envelope))
    db.execute("BEGIN IMMEDIATE")
    db.executemany(
        "INSERT INTO versions (key, hlc, envelope) VALUES (?, ?, ?) "
        "ON CONFLICT (key) DO UPDATE SET hlc = excluded.hlc, envelope = excluded.envelope "
        "WHERE excluded.hlc > hlc",
        rows,
    )
    db.execute("COMMIT")


@benchmark("raw.upsert_aead")
def bench_upsert_aead(bench: Bench) -> list[Line]:
    """The floor of a merge: open N sealed envelopes, upsert them where newer (half are)."""
    n = bench.sizes.merge_rows
    data = make_upsert_data(n)

    def verify(db: sqlite3.Connection) -> None:
        won = db.execute("SELECT count(*) FROM versions WHERE hlc = ?", (INBOUND_HLC,)).fetchone()
        check_equal("raw.upsert_aead newer versions stored", won[0], (n + 1) // 2)
        check_equal(
            "raw.upsert_aead rows", db.execute("SELECT count(*) FROM versions").fetchone()[0], n
        )
        db.close()

    seconds = best_seconds(
        bench,
        bench.sizes.repeats,
        lambda: prepare_upsert_table(bench, data),
        lambda db: open_and_upsert(db, data),
        verify,
    )
    extra = {"n": n, "newer": (n + 1) // 2, "envelope_bytes": len(data.inbound[0])}
    return [Line("raw.upsert_aead", n / seconds, "rows/s", extra=extra)]


# ---- the replica ----------------------------------------------------------------------------


def document(i: int, version: int = 1) -> dict[str, Any]:
    """A ~500-byte document (MessagePack) like a chat message."""
    return {"thread": f"thread-{i % 97:04d}", "version": version, "text": "x" * 456, "n": i}


def record_id(i: int) -> str:
    return f"note-{i:07d}"


def put_in_batches(replica: Replica, ids: range, batch: int, version: int = 1) -> None:
    """Put `ids` in transactions of `batch` puts each."""
    for start in range(ids.start, ids.stop, batch):
        with replica.batch():
            for i in range(start, min(start + batch, ids.stop)):
                replica.put(COLLECTION, record_id(i), document(i, version))


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


def put_each(replica: Replica, n: int) -> None:
    for i in range(n):
        replica.put(COLLECTION, record_id(i), document(i))


@benchmark("replica.put_single", needs=("raw.sqlite_upsert",))
def bench_replica_put_single(bench: Bench) -> list[Line]:
    """Replica.put with one transaction (and one fsync) per put."""
    n = bench.sizes.single_puts

    seconds = best_seconds(
        bench,
        bench.sizes.repeats,
        lambda: bench.replica("put-single"),
        lambda state: put_each(state[0], n),
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
    """A writer puts v1 of every record, then v2 over it; envelopes are read from its file."""
    options = ReplicaOptions(freshness_window_s=0, synchronous="normal")
    writer, path = bench.replica("writer", options)
    batch = bench.sizes.put_batch
    put_in_batches(writer, range(n), batch, version=1)
    v1 = envelopes_by_key(path)
    put_in_batches(writer, range(n), batch, version=2)
    v2 = envelopes_by_key(path)
    writer.close()
    check_equal("replica.merge records written", (len(v1), len(v2)), (n, n))
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


def make_merge_target(bench: Bench, data: MergeData) -> Path:
    """A closed replica file holding the initial half-v1, half-v2 state (WAL checkpointed)."""
    n = len(data.v1)
    target, path = bench.replica("merge-target", MERGE_OPTIONS)
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
    concurrent. Pages of PAGE_ENTRIES, each its own transaction, as a sync driver applies them.
    """
    n = bench.sizes.merge_rows
    data = bench.memo("merge_data", lambda: make_merge_data(bench, n))
    template = make_merge_target(bench, data)
    pages = pages_of(data.inbound(), n + 1, 2 * n)
    results: list[Applied] = []

    def run(state: tuple[Replica, Path]) -> None:
        results[:] = apply_pages(state[0], pages)

    seconds = best_seconds(
        bench,
        bench.sizes.merge_repeats,
        lambda: open_copy(bench, template),
        run,
        lambda state: verify_merge(*state, results, data),
    )
    extra = {
        "n": n,
        "page": PAGE_ENTRIES,
        "dominating": n // 2,
        "envelope_bytes": len(data.v1[0]),
        "document_bytes": len(msgspec.msgpack.encode(document(0))),
    }
    return [Line("replica.merge", n / seconds, "rows/s", "raw.upsert_aead", extra)]


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


# ---- command line ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (under 3 minutes)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument(
        "--only", action="append", default=[], metavar="PREFIX", help="run benchmarks by prefix"
    )
    parser.add_argument("--n", type=int, help="set every count to N (a tiny run, for tests)")
    parser.add_argument("--profile", action="store_true", help="cProfile the timed sections")
    parser.add_argument("--dir", type=Path, help="scratch folder parent (default: system temp)")
    args = parser.parse_args(argv)
    if args.n is not None and args.n < 2:
        parser.error("--n must be at least 2")
    unknown = [p for p in args.only if not any(name.startswith(p) for name in REGISTRY)]
    if unknown:
        parser.error(f"no benchmark starts with {unknown}; known: {', '.join(REGISTRY)}")
    return args


@contextmanager
def scratch_folder(parent: Path | None) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sealsync-bench-", dir=parent) as folder:
        yield Path(folder)


def run_benchmarks(prefixes: Sequence[str], bench: Bench) -> list[Line]:
    """Run the selected benchmarks; only those named by a prefix are profiled, not baselines."""
    lines: list[Line] = []
    for item in select(prefixes):
        print(f"running {item.name} ...", file=sys.stderr, flush=True)
        bench.profiling = not prefixes or item.name.startswith(tuple(prefixes))
        lines.extend(item.function(bench))
    return lines


def print_profile(profiler: cProfile.Profile) -> None:
    stats = pstats.Stats(profiler, stream=sys.stderr)
    stats.sort_stats("tottime").print_stats(PROFILE_TOP)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sizes = QUICK if args.quick else FULL
    if args.n is not None:
        sizes = sizes_with_n(sizes, args.n)
    profiler = cProfile.Profile() if args.profile else None
    with scratch_folder(args.dir) as folder:
        try:
            lines = run_benchmarks(args.only, Bench(sizes, folder, profiler))
        except BenchmarkError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    (print_json if args.json else print_table)(lines)
    if profiler is not None:
        print_profile(profiler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
