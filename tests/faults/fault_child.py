"""The child process of test_disk_faults: writes records to a real replica file, each in
its own transaction, while strace fails its system calls on that file.

Run as `python tests/faults/fault_child.py PATH BUNDLE_HEX KEY_HEX COUNT` with the project
root on PYTHONPATH: joins the account at PATH (or opens it), unlocks it with the raw key (no
Argon2id), and puts `n0` … `n{COUNT-1}`, printing `ack N` once a commit returned and
`refused N TYPE` when it raised one of sealsync's errors. Any other error escapes as a
traceback: what the test counts as untyped.
"""

from __future__ import annotations

import sys
from pathlib import Path

from replica import Replica
from replica.errors import SealsyncError


def main(path: Path, bundle: bytes, key: bytes, count: int) -> None:
    replica = Replica.open(path) if path.exists() else Replica.join(path, bundle)
    with replica:
        replica.unlock_with_key(key)
        for number in range(count):
            try:
                replica.put("notes", f"n{number}", {"text": f"note {number}"})
            except SealsyncError as exc:
                print(f"refused {number} {type(exc).__name__}", flush=True)
                continue
            print(f"ack {number}", flush=True)


if __name__ == "__main__":
    main(
        Path(sys.argv[1]), bytes.fromhex(sys.argv[2]), bytes.fromhex(sys.argv[3]), int(sys.argv[4])
    )
