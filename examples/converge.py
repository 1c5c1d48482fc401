"""Two devices edit offline, meet through the in-memory reference relay, and converge.

Run: python examples/converge.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from relay.memory import MemoryRelay
from replica import Collection, Replica, ReplicaOptions, Schema, SyncSession

SCHEMA = Schema(
    (
        Collection("threads", "lww", tiebreak="message_count"),
        Collection("messages", "lww"),
        Collection("personas", "per_item", max_items=50),
    )
)


def sync(session: SyncSession, relay: MemoryRelay, account: str) -> None:
    """Push every dirty version, then pull every page."""
    session.restart()
    while (batch := session.next_batch()) is not None:
        session.acknowledge(batch, relay.push(account, batch))
    while True:
        page = relay.pull(account, session.cursor)
        session.apply_page(page)
        if not page.has_more:
            return


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="sealsync-demo-"))
    options = ReplicaOptions(freshness_window_s=0)
    laptop, account = Replica.create(
        folder / "laptop.db", SCHEMA, "a long passphrase", options=options
    )
    phone = Replica.join(folder / "phone.db", laptop.key_bundle(), options=options)
    phone.unlock_with_recovery_key(account.recovery_key)
    relay = MemoryRelay(clock_ms=lambda: time.time_ns() // 1_000_000)

    laptop.put("threads", "t1", {"title": "Trip plans", "message_count": 1})
    laptop.put("messages", "t1/m1", {"thread": "t1", "text": "Where to?"})
    phone.put("messages", "t1/m2", {"thread": "t1", "text": "Somewhere warm."})
    phone.put("personas", "p1", {"name": "Travel agent"})

    for _ in range(2):
        for replica in (laptop, phone):
            sync(replica.sync_session(), relay, "demo")

    for name, replica in (("laptop", laptop), ("phone", phone)):
        texts = [r.document["text"] for r in replica.scan("messages")]
        personas = [r.document["name"] for r in replica.scan("personas")]
        print(f"{name}: messages={texts} personas={personas}")
    same = [r.document for r in laptop.scan("messages")] == [
        r.document for r in phone.scan("messages")
    ]
    print("converged" if same else "DIVERGED")
    print(f"relay stores {relay.stored_versions('demo')} sealed versions; replicas in {folder}")


if __name__ == "__main__":
    main()
