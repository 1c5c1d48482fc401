"""Versions a full resync set aside (replica/resync.py): listed, and taken back.

A resync sets aside a write of this device that the relay may have stored before another
device deleted it for good, and every held version the relay no longer has: merged or
pushed, either could bring back what a collection took. They stay in `held` (reason
`collected`), never merged or pushed, until the person looks: `set_aside` opens and lists
them; `take_aside` writes one back as a new version of its record, over whatever the record
shows now (it syncs like any write), and drops what was set aside of that record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replica import write
from replica.core import Core
from replica.envelope import Identity, Opened
from replica.errors import DegradedError, EnvelopeError, InvalidArgumentError
from replica.record import Context
from replica.resync import SET_ASIDE


@dataclass(frozen=True)
class AsideVersion:
    """A version a resync set aside."""

    profile: str
    collection: str
    id: str
    document: Any
    """None for a tombstone (`deleted`)."""
    deleted: bool
    hlc: int
    node: int


def set_aside(core: Core) -> list[AsideVersion]:
    """Every version set aside, opened, oldest first."""
    rows = core.store.db.execute(
        "SELECT envelope FROM held WHERE reason = ? ORDER BY hlc", (SET_ASIDE,)
    ).fetchall()
    return [_version(_open(core, envelope)) for (envelope,) in rows]


def take_aside(core: Core, identity: Identity) -> Context:
    """Write the newest version set aside of `identity`'s record back as a new version,
    and drop what was set aside of it: one transaction. The record's context after."""
    with core.write_transaction():
        key = core.record_key(identity)
        rows = core.store.db.execute(
            "SELECT envelope FROM held WHERE key = ? AND reason = ?", (key, SET_ASIDE)
        ).fetchall()
        if not rows:
            raise InvalidArgumentError(
                f"nothing of {identity.collection}/{identity.id} is set aside",
                hint="`sealsync aside` lists what is",
            )
        newest = max((_open(core, e) for (e,) in rows), key=lambda o: o.header.hlc)
        context = write.write_record(
            core,
            identity,
            None if newest.deleted else newest.document,
            deleted=newest.deleted,
            context=None,
            if_unchanged=False,
        )
        core.store.db.execute("DELETE FROM held WHERE key = ? AND reason = ?", (key, SET_ASIDE))
    return context


def _open(core: Core, envelope: bytes) -> Opened:
    try:
        return core.opener_or_raise().open(envelope)
    except EnvelopeError as exc:
        raise DegradedError(
            f"a version set aside cannot be opened: {exc}",
            hint="`sealsync diagnose` names it",
        ) from None


def _version(opened: Opened) -> AsideVersion:
    identity = opened.identity
    document = None if opened.deleted else opened.document
    header = opened.header
    return AsideVersion(
        identity.profile,
        identity.collection,
        identity.id,
        document,
        opened.deleted,
        header.hlc,
        header.node,
    )
