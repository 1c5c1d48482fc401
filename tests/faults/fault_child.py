"""The child process of test_disk_faults: writes to a real replica file, a transaction at a
time, while strace fails its system calls on that file.

Run as `python tests/faults/fault_child.py MODE PATH BUNDLE_HEX KEY_HEX ARG` with the project
root on PYTHONPATH: joins the account at PATH (or opens it) and unlocks it with the raw key
(no Argon2id). Modes:

- `put COUNT`: puts `n0` … `n{COUNT-1}`, one transaction each;
- `pull FILE`: merges the envelopes in FILE (MessagePack, a list) as pulled pages of
  `PAGE` envelopes, one transaction each;
- `repair COUNT`: runs `repair` COUNT times (the first does the work, the others find
  nothing left, or finish what a refused one did not).

With `SEALSYNC_TEST_FILE_SIZE_CEILING` set, no file may grow past that many bytes.

After each transaction it prints `ack N` once it returned, or `refused N TYPE` when it
raised one of sealsync's errors. Any other error escapes as a traceback: what the test
counts as untyped.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import msgspec

from replica import Replica
from replica.errors import SealsyncError
from replica.sync import SyncSession
from tests.replica.helpers import page_of

PAGE = 2
FILE_SIZE_CEILING = "SEALSYNC_TEST_FILE_SIZE_CEILING"
"""Bytes no file of the child may grow past (RLIMIT_FSIZE; Python ignores SIGXFSZ, so a
write past it fails with EFBIG, as on a file system with a file size limit)."""


def put_note(replica: Replica, number: int) -> None:
    replica.put("notes", f"n{number}", {"text": f"note {number}"})


def pull_page(session: SyncSession, envelopes: list[bytes]) -> None:
    session.apply_page(page_of(envelopes, session.cursor))


def steps(replica: Replica, mode: str, arg: str) -> list[Callable[[], object]]:
    """One callable per transaction."""
    if mode == "put":
        return [partial(put_note, replica, number) for number in range(int(arg))]
    if mode == "repair":
        return [replica.repair for _ in range(int(arg))]
    envelopes = msgspec.msgpack.decode(Path(arg).read_bytes(), type=list[bytes])
    session = replica.sync_session()
    pages = [envelopes[i : i + PAGE] for i in range(0, len(envelopes), PAGE)]
    return [partial(pull_page, session, page) for page in pages]


def main(mode: str, path: Path, bundle: bytes, key: bytes, arg: str) -> None:
    if ceiling := os.environ.get(FILE_SIZE_CEILING):  # past it, a write fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(ceiling), int(ceiling)))
    replica = Replica.open(path) if path.exists() else Replica.join(path, bundle)
    with replica:
        replica.unlock_with_key(key)
        for number, step in enumerate(steps(replica, mode, arg)):
            try:
                step()
            except SealsyncError as exc:
                print(f"refused {number} {type(exc).__name__}", flush=True)
                continue
            print(f"ack {number}", flush=True)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(arguments[0], Path(arguments[1]), bytes.fromhex(arguments[2]),
         bytes.fromhex(arguments[3]), arguments[4])  # fmt: skip
