"""The replica file's layout: its tables, as the numbered migrations that make them.

Step n brings a file from format n to n + 1 (`PRAGMA user_version`); `Store.migrate` runs the
missing steps in one transaction, so a file is always at one format or the next. A step may
call `sha256(blob)`, which `Store` defines on its connection. Tables and
what each column holds: specs/replica.md.
"""

from __future__ import annotations

APPLICATION_ID = 0x5EA15C
"""`PRAGMA application_id` of a replica file: tells it from any other SQLite database."""

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE meta (name TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
    CREATE TABLE versions (
        id INTEGER PRIMARY KEY,
        key BLOB NOT NULL, node INTEGER NOT NULL, hlc INTEGER NOT NULL,
        scope BLOB NOT NULL, vector BLOB NOT NULL, envelope BLOB NOT NULL,
        dirty INTEGER NOT NULL DEFAULT 0);
    CREATE INDEX versions_by_key ON versions (key);
    CREATE INDEX versions_by_scope ON versions (scope, key);
    CREATE INDEX versions_dirty ON versions (dirty) WHERE dirty = 1;
    CREATE TABLE held (
        key BLOB NOT NULL, node INTEGER NOT NULL, hlc INTEGER NOT NULL, digest BLOB NOT NULL,
        envelope BLOB NOT NULL, reason TEXT NOT NULL, release_after_ms INTEGER,
        scope BLOB, repush INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (key, node, hlc, digest));
    CREATE TABLE locks (
        id INTEGER PRIMARY KEY, kind TEXT NOT NULL, target BLOB NOT NULL,
        expires_ms INTEGER NOT NULL, dot_node INTEGER, dot_hlc INTEGER);
    CREATE INDEX locks_by_target ON locks (target);
    CREATE INDEX locks_by_expiry ON locks (expires_ms);
    CREATE INDEX held_by_release ON held (release_after_ms);
    CREATE TABLE local (
        key BLOB PRIMARY KEY, scope BLOB NOT NULL, envelope BLOB NOT NULL) WITHOUT ROWID;
    CREATE TABLE quarantine (
        id INTEGER PRIMARY KEY, source TEXT NOT NULL, key BLOB, node INTEGER, hlc INTEGER,
        envelope BLOB NOT NULL, reason TEXT NOT NULL, at_ms INTEGER NOT NULL);
    CREATE TABLE degraded (key BLOB PRIMARY KEY, scope BLOB, reason TEXT NOT NULL) WITHOUT ROWID;
    CREATE TABLE history (
        key BLOB NOT NULL, node INTEGER NOT NULL, hlc INTEGER NOT NULL,
        envelope BLOB NOT NULL, replaced_at_ms INTEGER NOT NULL,
        PRIMARY KEY (key, node, hlc)) WITHOUT ROWID;
    """,
    # 2: one quarantine row per envelope: a repair resets the cursor, and each re-pull of a
    # damaged envelope added another row for the same bytes (`sha256` is `Store`'s function)
    """
    ALTER TABLE quarantine ADD COLUMN digest BLOB;
    UPDATE quarantine SET digest = sha256(envelope);
    DELETE FROM quarantine WHERE id NOT IN (SELECT min(id) FROM quarantine GROUP BY digest);
    CREATE UNIQUE INDEX quarantine_by_digest ON quarantine (digest);
    """,
    # 3: meta `schema` holds the schema sealed under the account key; a clear one (written
    # by earlier formats, or by a join while locked) waits as `clear_schema` for the next
    # unlock to seal it and scrub it from the file (`Core.unlock`)
    """
    UPDATE meta SET name = 'clear_schema' WHERE name = 'schema';
    """,
    # 4: the earlier sealing of a pending write re-sealed under a newer key epoch after a
    # rotation (replica/reseal.py), kept until the write is acknowledged
    """
    CREATE TABLE resealed (
        key BLOB NOT NULL, node INTEGER NOT NULL, hlc INTEGER NOT NULL,
        envelope BLOB NOT NULL, PRIMARY KEY (key, node, hlc)) WITHOUT ROWID;
    """,
    # 5: no earlier sealing is kept any more: the relay replaces a version's earlier sealing
    # by a later one (relay/versions.py), so it never has to be pushed back
    """
    DROP TABLE resealed;
    """,
    # 6: blind indexes (replica/blind.py): a version of a collection declared with an index
    # carries the HMAC of its indexed value and its creation order; NULL for the others
    """
    ALTER TABLE versions ADD COLUMN blind BLOB;
    ALTER TABLE versions ADD COLUMN created INTEGER;
    CREATE INDEX versions_by_blind ON versions (blind, created, key) WHERE blind IS NOT NULL;
    """,
    # 7: the local change feed (replica/feed.py): each record's rows carry the sequence number
    # of its latest change (0: before the feed began); the feed's id names this file's history
    """
    ALTER TABLE versions ADD COLUMN changed INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE local ADD COLUMN changed INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX versions_by_change ON versions (changed);
    CREATE INDEX local_by_change ON local (changed);
    INSERT INTO meta (name, value) VALUES ('feed_id', lower(hex(randomblob(16))));
    """,
    # 8: leases (replica/leases.py): one holder at a time per name, across processes; the
    # name is an HMAC of the app's, the owner a random id per taker
    """
    CREATE TABLE leases (
        name BLOB PRIMARY KEY, owner BLOB NOT NULL, expires_ms INTEGER NOT NULL) WITHOUT ROWID;
    """,
    # 9: journals (replica/journal.py): bounded device-local logs, each entry one row, a
    # journal's rows side by side in the order pushed; `log` names the journal, `key` the
    # entry as a record key would, `floor` the lowest seq the journal kept at its push
    """
    CREATE TABLE journal (
        log BLOB NOT NULL, seq INTEGER NOT NULL, floor INTEGER NOT NULL, key BLOB NOT NULL,
        scope BLOB NOT NULL, envelope BLOB NOT NULL, PRIMARY KEY (log, seq)) WITHOUT ROWID;
    """,
    # 10: whether each version is a tombstone (1) or not (0), known without opening it; NULL
    # for rows stored before, until an unlock opens them (replica/tombs.py), which finds
    # them by the partial index (empty once they are known, so it costs later writes nothing)
    """
    ALTER TABLE versions ADD COLUMN tomb INTEGER;
    CREATE INDEX versions_unclassified ON versions (id) WHERE tomb IS NULL;
    """,
    # 11: a file that signed pushes before meta `offered_through` was kept counts all it
    # wrote so far as possibly offered (a full resync sets such a write aside, not pushes it)
    """
    INSERT INTO meta (name, value) SELECT 'offered_through', value FROM meta
    WHERE name = 'clock' AND EXISTS (SELECT 1 FROM meta WHERE name = 'push_counter')
    AND NOT EXISTS (SELECT 1 FROM meta WHERE name = 'offered_through');
    """,
    # 12: a version whose entry in a journal is deferred (replica/journal.py): the journal's
    # key until `journal_deferred` hands the write over; the partial index holds only those
    """
    ALTER TABLE versions ADD COLUMN awaits BLOB;
    CREATE INDEX versions_awaiting ON versions (awaits) WHERE awaits IS NOT NULL;
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)
