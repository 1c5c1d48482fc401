"""`Replica.version_stamp`: what names a record's versions, read without opening one, so an
app may keep what it checked of a record while the stamp stays the same."""

from __future__ import annotations

import pytest

from replica.errors import InvalidArgumentError
from tests.conftest import ReplicaFactory
from tests.replica.helpers import apply, dirty_envelopes


def test_a_stamp_changes_with_every_write_and_merge_and_only_then(
    make_replica: ReplicaFactory,
) -> None:
    here = make_replica("here", freshness_window_s=0)  # nothing inbound held back
    there = make_replica("there")
    assert here.version_stamp("notes", "n") == ()
    here.put("notes", "n", {"text": "one"})
    first = here.version_stamp("notes", "n")
    assert len(first) == 1 and here.version_stamp("notes", "n") == first  # reads change nothing
    here.get("notes", "n")
    assert here.version_stamp("notes", "n") == first
    there.put("notes", "n", {"text": "concurrent"})
    apply(here, dirty_envelopes(there))
    merged = here.version_stamp("notes", "n")
    assert merged and merged != first  # a concurrent edit merged in
    here.delete("notes", "n")
    assert here.version_stamp("notes", "n") not in (first, merged)


def test_a_device_local_collection_has_no_stamp(make_replica: ReplicaFactory) -> None:
    with pytest.raises(InvalidArgumentError, match="device-local"):
        make_replica().version_stamp("drafts", "d")
