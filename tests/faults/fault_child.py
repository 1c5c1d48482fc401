"""The child process of test_disk_faults: writes to a real replica file, a transaction at a
time, while strace fails its system calls on that file.

Run as `python tests/faults/fault_child.py MODE PATH BUNDLE_HEX KEY_HEX ARG` with the project
root on PYTHONPATH: joins the account at PATH (or opens it) and unlocks it with the raw key
(no Argon2id). Modes:

- `put COUNT`: puts `n0` … `n{COUNT-1}`, one transaction each;
- `pull FILE`: merges the envelopes in FILE (MessagePack, a list) as pulled pages of
  `PAGE` envelopes, one transaction each;
- `repair COUNT`: runs `repair` COUNT times (the first does the work, the others find
  nothing left, or finish what a refused one did not);
- `changes COUNT`: reads the change feed COUNT times (a read transaction each);
- `batch COUNT`: COUNT batches, each a put of `a{N}`, a put of a larger `b{N}` whose failure
  the app catches and goes on from, and a put of `c{N}`: a batch is kept whole or not at
  all;
- `reseed TRIES`: reseeds onto a new, empty relay (in this process, as after a wipe): the
  reseed's transaction, tried up to TRIES times until it is taken, then pushes of `PAGE`
  versions, each acknowledged in one transaction, passes again until none is dirty (at
  most `ROUNDS` passes' worth of `WRITES`), and pulls of the relay's pages; last,
  `relay KEY…` (hex) lists the versions the relay holds.

With `SEALSYNC_TEST_FILE_SIZE_CEILING` set, no file may grow past that many bytes; with
`SEALSYNC_TEST_HEAP_LIMIT`, SQLite may allocate at most that many bytes more than it holds
once the replica is unlocked (its hard heap limit, which holds for the whole process).

After each transaction it prints `ack N` once it returned, or `refused N TYPE` when it
raised one of sealsync's errors. Any other error escapes as a traceback: what the test
counts as untyped.
"""

from __future__ import annotations

import _sqlite3
import contextlib
import ctypes
import os
import resource
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path

import msgspec

from relay.memory import MemoryRelay
from replica import Replica
from replica.errors import SealsyncError
from replica.sync import SyncSession
from replica.wire import parse_header
from tests.replica.helpers import page_of

PAGE = 2
WRITES = 6
ROUNDS = 4
PULLS = 16
ACCOUNT = "acct"
HEAP_LIMIT = "SEALSYNC_TEST_HEAP_LIMIT"
FILE_SIZE_CEILING = "SEALSYNC_TEST_FILE_SIZE_CEILING"
"""Bytes no file of the child may grow past (RLIMIT_FSIZE; Python ignores SIGXFSZ, so a
write past it fails with EFBIG, as on a file system with a file size limit)."""


def put_note(replica: Replica, number: int) -> None:
    replica.put("notes", f"n{number}", {"text": f"note {number}"})


def pull_page(session: SyncSession, envelopes: list[bytes]) -> None:
    session.apply_page(page_of(envelopes, session.cursor))


def read_changes(replica: Replica) -> None:
    replica.changes(limit=1000)


def batch_of_three(replica: Replica, number: int) -> None:
    """Three puts in one batch; the middle one's failure is caught, as an app might."""
    with replica.batch():
        replica.put("notes", f"a{number}", {"text": f"first of batch {number}"})
        with contextlib.suppress(Exception):  # the app goes on without it
            replica.put("notes", f"b{number}", {"text": "x" * 20_000})
        replica.put("notes", f"c{number}", {"text": f"last of batch {number}"})


def set_heap_limit(headroom: int) -> None:
    """Let SQLite allocate at most `headroom` bytes more than it holds now (through its own
    `sqlite3_hard_heap_limit64`, what `PRAGMA hard_heap_limit` sets): a limit above what it
    holds, whatever that is on this machine and version."""
    library = sqlite_library()
    library.sqlite3_memory_used.restype = ctypes.c_int64
    library.sqlite3_hard_heap_limit64.restype = ctypes.c_int64
    library.sqlite3_hard_heap_limit64.argtypes = [ctypes.c_int64]
    library.sqlite3_hard_heap_limit64(library.sqlite3_memory_used() + headroom)


def sqlite_library() -> ctypes.CDLL:
    """The SQLite library under this Python's sqlite3 module (or the module, where SQLite
    is linked into it)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        if "libsqlite3" in line:
            return ctypes.CDLL(line.split()[-1])
    return ctypes.CDLL(_sqlite3.__file__)


class Reseed:
    """A reseed onto `relay`, a transaction a step: each step reads what it needs itself (a
    read may be refused too), and notes when there is nothing left to do."""

    def __init__(self, replica: Replica, relay: MemoryRelay) -> None:
        self.session = replica.sync_session(max_batch_count=PAGE)
        self.relay = relay
        self.taken = self.pushed = self.pulled = False

    def reseed(self) -> None:
        self.session.reseed()
        self.taken = True

    def push_next(self) -> None:
        batch = self.session.next_batch()
        if batch is None and self.session.count_dirty():
            self.session.restart()  # what a refused acknowledgement left dirty, again
            batch = self.session.next_batch()
        if batch is None:
            self.pushed = True
            return
        self.session.acknowledge(batch, self.relay.push(ACCOUNT, batch))

    def pull_next(self) -> None:
        if self.session.cursor == self.relay.state(ACCOUNT).head:
            self.pulled = True
            return
        self.session.apply_page(self.relay.pull(ACCOUNT, self.session.cursor, PAGE))


def reseed(replica: Replica, relay: MemoryRelay, tries: int) -> Iterator[Callable[[], object]]:
    """The reseed's steps, each yielded once the one before it ended."""
    work = Reseed(replica, relay)
    for _ in range(tries):
        yield work.reseed
        if work.taken:
            break
    else:
        return  # never taken: nothing to push
    for _ in range(ROUNDS * WRITES):
        yield work.push_next
        if work.pushed:
            break
    for _ in range(PULLS):
        yield work.pull_next
        if work.pulled:
            break


def relay_keys(relay: MemoryRelay) -> list[str]:
    entries = relay.pull(ACCOUNT, 0, 10_000).entries
    return [parse_header(entry.envelope).key.hex() for entry in entries]


def steps(
    replica: Replica, relay: MemoryRelay, mode: str, arg: str
) -> Iterable[Callable[[], object]]:
    """One callable per transaction."""
    if mode == "put":
        return [partial(put_note, replica, number) for number in range(int(arg))]
    if mode == "repair":
        return [replica.repair for _ in range(int(arg))]
    if mode == "reseed":
        return reseed(replica, relay, int(arg))
    if mode == "changes":
        return [partial(read_changes, replica) for _ in range(int(arg))]
    if mode == "batch":
        return [partial(batch_of_three, replica, number) for number in range(int(arg))]
    envelopes = msgspec.msgpack.decode(Path(arg).read_bytes(), type=list[bytes])
    session = replica.sync_session()
    pages = [envelopes[i : i + PAGE] for i in range(0, len(envelopes), PAGE)]
    return [partial(pull_page, session, page) for page in pages]


def main(mode: str, path: Path, bundle: bytes, key: bytes, arg: str) -> None:
    if ceiling := os.environ.get(FILE_SIZE_CEILING):  # past it, a write fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(ceiling), int(ceiling)))
    replica = Replica.open(path) if path.exists() else Replica.join(path, bundle)
    relay = MemoryRelay(clock_ms=lambda: time.time_ns() // 1_000_000)
    with replica:
        replica.unlock_with_key(key)
        if limit := os.environ.get(HEAP_LIMIT):  # past it, SQLite's allocations fail (NOMEM)
            set_heap_limit(int(limit))
        for number, step in enumerate(steps(replica, relay, mode, arg)):
            try:
                step()
            except SealsyncError as exc:
                print(f"refused {number} {type(exc).__name__}", flush=True)
                continue
            print(f"ack {number}", flush=True)
    if mode == "reseed":
        print("relay", *relay_keys(relay), flush=True)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(arguments[0], Path(arguments[1]), bytes.fromhex(arguments[2]),
         bytes.fromhex(arguments[3]), arguments[4])  # fmt: skip
