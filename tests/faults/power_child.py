"""The child process of test_power_loss: commits batches to a real replica file while strace
records every system call on it, with the bytes written.

Run as `python tests/faults/power_child.py PATH BUNDLE_HEX KEY_HEX SYNCHRONOUS BATCHES` with
the project root on PYTHONPATH: joins the account at PATH, unlocks it with the raw key (no
Argon2id), prints `ready`, then commits `BATCHES` batches of `PER_BATCH` notes, printing
`ack N` once batch N returned. Halfway it closes the replica (which checkpoints the log into
the file and removes the log) and opens it again.
"""

from __future__ import annotations

import sys
from pathlib import Path

from replica import Replica, ReplicaOptions

PER_BATCH = 3


def note_id(batch: int, item: int) -> str:
    return f"n{batch * PER_BATCH + item}"


def commit(replica: Replica, batch: int) -> None:
    with replica.batch():
        for item in range(PER_BATCH):
            replica.put("notes", note_id(batch, item), {"text": f"batch {batch} note {item}"})


def main(path: Path, bundle: bytes, key: bytes, synchronous: str, batches: int) -> None:
    options = ReplicaOptions(synchronous=synchronous)  # type: ignore[arg-type]
    replica = Replica.join(path, bundle, options=options)
    replica.unlock_with_key(key)
    print("ready", flush=True)
    for batch in range(batches):
        if batch == batches // 2:
            replica.close()
            replica = Replica.open(path, options=options)
            replica.unlock_with_key(key)
        commit(replica, batch)
        print(f"ack {batch}", flush=True)
    replica.close()


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(Path(arguments[0]), bytes.fromhex(arguments[1]), bytes.fromhex(arguments[2]),
         arguments[3], int(arguments[4]))  # fmt: skip
