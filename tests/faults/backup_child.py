"""The child process of test_backup_faults: takes a backup of a replica, or restores one,
while strace fails its system calls. The outcome is the exit status, not a line printed: a
write to standard output would be one of the calls that fail.

Run as `python tests/faults/backup_child.py backup REPLICA FOLDER`, `... restore BACKUP
TARGET` or `... verify BACKUP -` with the project root on PYTHONPATH. Exit 0: done (a
backup that verifies); 3: refused with one of sealsync's errors (typed); 5: `verify` found
the backup damaged or unreadable; anything else (a traceback): an untyped error.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

from clients.backup import backup_replica, restore_replica
from clients.verify import verify_backup
from replica.errors import SealsyncError

REFUSED = 3
NOT_GOOD = 5
"""`verify`: the backup was found damaged or unreadable."""


def main(mode: str, source: Path, target: Path) -> int:
    if mode == "verify":
        return 0 if verify_backup(source).state == "ok" else NOT_GOOD
    try:
        if mode == "backup":
            backup_replica(source, target, datetime.datetime.now(datetime.UTC))
        else:
            restore_replica(source, target, force=True)
    except SealsyncError:
        return REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])))
