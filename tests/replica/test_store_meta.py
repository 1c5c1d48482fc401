"""The store's meta values, cached for the length of one write transaction (replica/store.py):
never staler than the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from replica.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "meta.db")
    store.migrate()
    return store


def test_a_rolled_back_savepoint_takes_its_meta_writes_with_it(store: Store) -> None:
    with store.transaction():
        store.set_meta("clock", 5)
        with pytest.raises(RuntimeError), store.transaction():
            store.set_meta("clock", 9)
            assert store.get_int("clock") == 9
            raise RuntimeError("roll the savepoint back")
        assert store.get_int("clock") == 5
    assert store.get_int("clock") == 5


def test_a_value_another_connection_wrote_between_transactions_is_read(tmp_path: Path) -> None:
    first, second = Store(tmp_path / "meta.db"), Store(tmp_path / "meta.db")
    first.migrate()
    with first.transaction():
        first.set_meta("clock", 1)
        assert first.get_int("clock") == 1
    with second.transaction():
        second.set_meta("clock", 2)
    with first.transaction():
        assert first.get_int("clock") == 2
    first.close()
    second.close()
