"""Two devices syncing through a shared folder (issue 14): `folder.e2e_10k`, the same records
as `sync.e2e_10k` of the same run, which is its baseline.

A writes N ~500-byte records (untimed, `put_batch` per transaction); then the clock runs
from A's round (its segments written and fsynced) to the end of B's (every file opened,
verified and merged). The folder is a local one: a file-sync tool's transfer is not timed,
as the relay's network is loopback in the baseline. One process, one round after the other:
a folder has no relay to overlap with.
"""

from __future__ import annotations

import time

from engine import count_versions, document, put_in_batches, record_id
from harness import COLLECTION, Bench, Line, benchmark, check_equal
from sync_http import LABEL_BY_POSITION

from clients.folder import FolderSync, make_folder


@benchmark("folder.e2e", needs=("sync.e2e",))
def bench_folder_e2e(bench: Bench) -> list[Line]:
    n = bench.sizes.sync_records[0]
    a, _ = bench.replica("folder-a")
    b, b_path = bench.replica("folder-b")
    folder = bench.path("folder").with_suffix("")
    make_folder(folder, a.key_bundle(), a.key_generation)
    put_in_batches(a, range(n), bench.sizes.put_batch)
    start = time.perf_counter()
    written = FolderSync(a, folder).sync()
    a_done = time.perf_counter()
    FolderSync(b, folder).sync()
    b_done = time.perf_counter()
    check_equal("folder.e2e versions written by A", written.pushed, n)
    check_equal("folder.e2e versions on B", count_versions(b_path), n)
    for i in (0, n // 2, n - 1):
        record = b.get(COLLECTION, record_id(i))
        check_equal(f"folder.e2e record {i} on B", record and record.document, document(i, 1))
    a.close()
    b.close()
    extra = {
        "n": n,
        "segments": written.segments,
        "a_write_s": round(a_done - start, 3),
        "b_read_merge_s": round(b_done - a_done, 3),
        "folder_bytes": sum(p.stat().st_size for p in folder.rglob("*.seg")),
    }
    label = LABEL_BY_POSITION[0]
    return [
        Line(f"folder.e2e_{label}", n / (b_done - start), "records/s", f"sync.e2e_{label}", extra)
    ]
