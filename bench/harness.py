"""The benchmark harness: result lines, sizes, the scratch workspace, timing and the registry.

Benchmarks live in `raw.py` (plain sqlite3 and AES-GCM: the baselines), `engine.py` (the
replica), `relay_http.py` (the relay over HTTP, with `server.py`, `load.py` and `device.py`
beside it) and `sync_http.py` (two real devices syncing through it); `run.py` is the command
line. See run.py for what the figures mean.
"""

import cProfile
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/run.py` from a checkout, without installing
    sys.path.insert(0, str(ROOT))


from replica import (  # noqa: E402
    Collection,
    Replica,
    ReplicaOptions,
    Schema,
)

RATE_UNITS = frozenset(
    {"rows/s", "ops/s", "envelopes/s", "requests/s", "records/s", "opens/s", "messages/s", "MB/s"}
)
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
    merge_rows: int  # raw.upsert_aead and replica.merge share it (and merge_repeats): a fair ratio
    fresh_locks: int  # replica.merge_locks: local records under a freshness lock, and merged
    puts: int
    put_batch: int
    single_puts: int
    repeats: int
    merge_repeats: int
    relay_envelopes: int  # relay.push and relay.pull
    echo_s: float  # raw.starlette_echo: seconds of closed-loop load
    load_devices: int  # relay.load: simulated devices, open loop
    load_s: float  # relay.load: seconds of arrivals
    sync_records: tuple[int, ...]  # sync.*: records two devices share, the "10k" then "100k"
    live_writes: int  # sync.live: writes timed from A to B
    chat_messages: tuple[int, int]  # chat.open and chat.search: messages, 200 a chat
    scale_records: int  # sync.scale: records one device pushes and another joins


FULL = Sizes(
    200_000, 200_000, 100_000, 5_000, 20_000, 1000, 1000, 5, 5, 50_000, 10.0, 200, 60.0,
    (10_000, 100_000), 50, (20_000, 200_000), 1_000_000,
)  # fmt: skip
QUICK = Sizes(
    50_000, 50_000, 20_000, 2_000, 5_000, 1000, 300, 3, 2, 10_000, 3.0, 50, 10.0, (10_000,), 50,
    (2_000, 20_000), 100_000,
)  # fmt: skip


def sizes_with_n(sizes: Sizes, n: int) -> Sizes:
    """Every count set to `n` (a tiny run for tests of this script); repeats kept, the
    HTTP load benchmarks cut to a second or two, and the sync benchmarks run at one size."""
    return replace(
        sizes,
        sqlite_rows=n,
        aead_ops=n,
        merge_rows=n,
        fresh_locks=n,
        puts=n,
        put_batch=min(sizes.put_batch, n),
        single_puts=n,
        relay_envelopes=n,
        echo_s=min(sizes.echo_s, 1.0),
        load_devices=min(sizes.load_devices, n),
        load_s=min(sizes.load_s, 2.0),
        sync_records=(n,),
        live_writes=min(sizes.live_writes, n),
        chat_messages=(max(n, 200), max(n, 200) * 2),
        scale_records=n,
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
            self._account = Account(replica.key_bundle(), replica.unlock_key())
            replica.close()
        return self._account

    def account_folder(self, stem: str) -> Path:
        """A new folder holding the run's account as a device process reads it: its key
        bundle (`bundle`) and raw key (`key`), so the process skips Argon2id."""
        self._files += 1
        folder = self.folder / f"{stem}-{self._files}"
        folder.mkdir()
        account = self.account()
        (folder / "bundle").write_bytes(account.bundle)
        (folder / "key").write_bytes(account.key)
        return folder

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


def no_check(_: object) -> None:
    """For runs whose effect is nothing but time."""


def check_equal(what: str, got: object, expected: object) -> None:
    if got != expected:
        raise BenchmarkError(f"{what}: got {got}, expected {expected}")
