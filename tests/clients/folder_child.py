"""The child process test_folder_kill.py SIGKILLs: one device syncing through a folder.

Run as `python tests/clients/folder_child.py REPLICA FOLDER KEY_HEX FIRST` with the project
root on PYTHONPATH: it opens the replica (unlocked with the raw account key), prints `ready`,
then loops until killed: puts record `n` (FIRST, FIRST + 1, ...) in its own transaction and
prints `committed n` once it returns; every third record it runs a folder round, with small
segments and a snapshot every four, printing `synced` after it. Each line is flushed at once.
"""

from __future__ import annotations

import sys
from pathlib import Path

from clients.folder import FolderSync
from replica import Replica


def main(replica_path: str, folder: str, key_hex: str, first: str) -> None:
    replica = Replica.open(replica_path)
    replica.unlock_with_key(bytes.fromhex(key_hex))
    print("ready", flush=True)
    n = int(first)
    while True:
        replica.put("notes", f"n{n}", {"text": "x" * 2000, "n": n})
        print(f"committed {n}", flush=True)
        if n % 3 == 0:
            FolderSync(replica, Path(folder), snapshot_every=4, max_batch_bytes=8000).sync()
            print("synced", flush=True)
        n += 1


if __name__ == "__main__":
    main(*sys.argv[1:])
