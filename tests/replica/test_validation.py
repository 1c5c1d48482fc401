"""Bad input (specs/limits.md): every public write validates its arguments, names the value
and the bound, and writes nothing."""

from __future__ import annotations

import math
import reprlib
import sqlite3
from collections.abc import Callable
from contextlib import closing
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replica import Collection, InvalidArgumentError, Replica, Schema
from replica.limits import MAX_DOCUMENT_BYTES, MAX_ID_CHARS, MAX_NESTING, check_document
from tests.conftest import ReplicaFactory

BAD_IDS: list[tuple[object, str]] = [
    ("", "1..256"),
    ("x" * (MAX_ID_CHARS + 1), "257 characters"),
    ("a\x00b", "NUL"),
    ("e\u0301", "NFC"),
    (42, "must be a str"),
]


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth - 1):
        value = [value]
    return value


BAD_DOCUMENTS: list[tuple[object, str]] = [
    ({"x": math.nan}, "non-finite"),
    ({"x": math.inf}, "non-finite"),
    ({"x": 2**64}, "outside 64 bits"),
    ({"x": -(2**63) - 1}, "outside 64 bits"),
    ({1: "x"}, "not a str"),
    ({"x": {1, 2}}, "not JSON-compatible"),
    ({"x": b"bytes"}, "not JSON-compatible"),
    (nested(MAX_NESTING + 1), "deeper than 64"),
    ({"x": "y" * MAX_DOCUMENT_BYTES}, "bound 1048576"),
]


def assert_nothing_written(replica: Replica) -> None:
    status = replica.status()
    assert (status.records, status.dirty) == (0, 0)


NAMED_CALLS: dict[str, Callable[[Replica, Any, Any, Any], object]] = {
    "get": lambda r, c, i, p: r.get(c, i, profile=p),
    "conflicts": lambda r, c, i, p: r.conflicts(c, i, profile=p),
    "history": lambda r, c, i, p: r.history(c, i, profile=p),
    "scan": lambda r, c, i, p: r.scan(c, profile=p),
    "put": lambda r, c, i, p: r.put(c, i, {"v": 1}, profile=p),
    "delete": lambda r, c, i, p: r.delete(c, i, profile=p),
    "update": lambda r, c, i, p: r.update(c, i, lambda _: {"v": 1}, profile=p),
    "lock_scope": lambda r, c, i, p: r.lock_scope(profile=p, collection=c, id=i, duration_s=5),
    "clear": lambda r, c, i, p: r.clear(c, profile=p),
}
"""Every public call that names a record, collection or profile, by (collection, id, profile)."""
POSITIONS: dict[str, Callable[[object], tuple[object, object, object]]] = {
    "collection": lambda bad: (bad, "n", "default"),
    "id": lambda bad: ("notes", bad, "default"),
    "profile": lambda bad: ("notes", "n", bad),
}


def file_rows(replica: Replica) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the replica's file, read through a connection of our own."""
    with closing(sqlite3.connect(replica.path)) as db:
        tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: sorted(db.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in tables}


def shown(value: object) -> str:
    """How an error names a bad value: a str by its repr (first 40 characters), else reprlib."""
    return repr(value[:40]) if isinstance(value, str) else reprlib.repr(value)


@pytest.mark.parametrize(
    ("call", "position"),
    [(c, p) for c in NAMED_CALLS for p in POSITIONS if not (p == "id" and c in ("scan", "clear"))],
)
@pytest.mark.parametrize(("bad", "bound"), BAD_IDS)
def test_bad_names_are_refused_naming_the_value_and_the_bound(
    make_replica: ReplicaFactory, call: str, position: str, bad: object, bound: str
) -> None:
    replica = make_replica()
    replica.put("notes", "kept", {"v": 0})
    before = file_rows(replica)
    collection, id, profile = POSITIONS[position](bad)
    with pytest.raises(InvalidArgumentError) as refused:
        NAMED_CALLS[call](replica, collection, id, profile)
    message = str(refused.value)
    assert message.startswith(position) and shown(bad) in message and bound in message, message
    assert file_rows(replica) == before


@pytest.mark.parametrize("call", NAMED_CALLS)
def test_undeclared_collections_are_refused_by_every_call(
    make_replica: ReplicaFactory, call: str
) -> None:
    replica = make_replica()
    replica.put("notes", "kept", {"v": 0})
    before = file_rows(replica)
    with pytest.raises(InvalidArgumentError, match="'nope' is not declared"):
        NAMED_CALLS[call](replica, "nope", "n", "default")
    assert file_rows(replica) == before


@pytest.mark.parametrize(("bad", "bound"), BAD_IDS)
def test_bad_profile_names_are_refused_on_creation(
    make_replica: ReplicaFactory, bad: object, bound: str
) -> None:
    replica = make_replica()
    before = file_rows(replica)
    with pytest.raises(InvalidArgumentError) as refused:
        replica.create_profile(bad)  # type: ignore[arg-type]  # BAD_IDS holds a non-str on purpose
    assert shown(bad) in str(refused.value) and bound in str(refused.value)
    assert file_rows(replica) == before


@pytest.mark.parametrize(("bad", "message"), BAD_DOCUMENTS, ids=lambda v: str(v)[:30])
def test_bad_documents_are_refused_with_the_bound(
    make_replica: ReplicaFactory, bad: object, message: str
) -> None:
    replica = make_replica()
    with pytest.raises(InvalidArgumentError, match=message):
        replica.put("notes", "n", bad)
    with pytest.raises(InvalidArgumentError, match=message):
        replica.update("notes", "n", lambda _: bad)
    assert_nothing_written(replica)


def test_documents_at_the_bounds_are_accepted(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    replica.put("notes", "x" * MAX_ID_CHARS, {"deep": nested(MAX_NESTING - 1)})
    replica.put("notes", "ints", {"min": -(2**63), "max": 2**64 - 1})
    big = {"x": "y" * (MAX_DOCUMENT_BYTES - 64)}
    replica.put("notes", "big", big)
    got = replica.get("notes", "big")
    assert got is not None and got.document == big


def test_a_batch_that_fails_writes_nothing(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    with pytest.raises(InvalidArgumentError), replica.batch():
        replica.put("notes", "ok", {"v": 1})
        replica.put("notes", "bad", {"v": math.nan})
    assert_nothing_written(replica)


def test_schema_values_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown policy"):
        Collection("c", "bogus")  # type: ignore[arg-type]  # a policy outside the Literal on purpose
    with pytest.raises(InvalidArgumentError, match="max_items"):
        Collection("c", "lww", max_items=3)
    with pytest.raises(InvalidArgumentError, match="twice"):
        Schema((Collection("c"), Collection("c")))
    with pytest.raises(InvalidArgumentError, match="reserved"):
        Schema((Collection("sealsync.profiles"),))


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_every_json_compatible_value_passes_the_check(value: object) -> None:
    check_document(value)


@pytest.mark.parametrize(
    "values",
    [
        {"freshness_window_s": -1},
        {"max_lock_s": 0},
        {"max_drift_ms": -5},
        {"busy_timeout_s": -1},
        {"cache_entries": -1},
        {"synchronous": "off"},
    ],
)
def test_options_out_of_bounds_are_refused(values: dict[str, object]) -> None:
    from replica import ReplicaOptions

    with pytest.raises(InvalidArgumentError):
        ReplicaOptions(**values)  # type: ignore[arg-type]  # e.g. synchronous="off", refused on purpose


def test_lock_durations_out_of_bounds_are_refused(make_replica: ReplicaFactory) -> None:
    replica = make_replica(max_lock_s=60)
    for duration in (0, -1, 61):
        with pytest.raises(InvalidArgumentError, match="lock duration"):
            replica.lock_scope(collection="notes", duration_s=duration)
    with pytest.raises(InvalidArgumentError, match="needs its collection"):
        replica.lock_scope(id="n")
    assert replica.lock_scope(collection="notes", duration_s=60) > 0


@pytest.mark.parametrize("context", ["abc", [(1, 2)], frozenset({("a", 1)}), frozenset({(1,)})])
def test_a_malformed_context_is_refused(make_replica: ReplicaFactory, context: object) -> None:
    replica = make_replica()
    with pytest.raises(InvalidArgumentError, match="context must be"):
        replica.put("notes", "n", {}, context=context)  # type: ignore[arg-type]  # malformed on purpose
    assert_nothing_written(replica)


def test_wrong_types_raise_the_typed_error_not_a_type_error(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    # Each call passes a wrong type on purpose: the runtime check, not mypy, is the subject.
    calls: list[Callable[[], object]] = [
        lambda: replica.lock_scope(collection="notes", duration_s="soon"),  # type: ignore[arg-type]  # wrong type on purpose
        lambda: replica.sync_session(max_batch_count="many"),  # type: ignore[arg-type]  # wrong type on purpose
        lambda: replica.unlock(12345),  # type: ignore[arg-type]  # wrong type on purpose
        lambda: replica.scan(7),  # type: ignore[arg-type]  # wrong type on purpose
        lambda: replica.create_profile(None),  # type: ignore[arg-type]  # wrong type on purpose
    ]
    for call in calls:
        with pytest.raises(InvalidArgumentError):
            call()
