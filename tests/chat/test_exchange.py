"""Export and import (chat/exchange.py): an export imported elsewhere reproduces the profile
exactly (property-tested over generated chats); an import never replaces or deletes what is
here, reports what differs, imports it as copies when asked, and changes nothing when run
twice."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chat import ChatStore, NoSuchChatError, with_chat
from chat.exchange import export_profile, import_export
from chat.limits import decode
from chat.schema import MESSAGES, THREADS
from replica import InvalidArgumentError, Replica
from tests.chat.conftest import StoreFactory, a_chat
from tests.clients.test_cli import dump
from tests.conftest import SCHEMA

ROOT = Path(__file__).resolve().parents[2]
TEXT = st.text(max_size=40)
SETTING_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)
ROLES = st.sampled_from(["user", "assistant"])
THUMBNAILS = st.lists(st.binary(max_size=20), max_size=2)
NAMES = st.text(
    st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1, max_size=10
).filter(
    lambda name: unicodedata.is_normalized("NFC", name)  # a setting's name is part of an id
)
CHATS = st.lists(
    st.tuples(
        TEXT,  # title
        st.lists(st.tuples(ROLES, TEXT, THUMBNAILS), max_size=4),
        st.dictionaries(NAMES, SETTING_VALUES, max_size=3),
        st.booleans(),  # archived
    ),
    max_size=4,
)


def fill(store: ChatStore, chats: list[Any], personas: list[str]) -> None:
    persona_ids = [store.create_persona(name or "p", f"prompt {name}") for name in personas]
    if persona_ids:
        store.set_active_persona(persona_ids[-1])
    for title, messages, chat_settings, archived in chats:
        thread = store.new_chat(
            title or "untitled", persona=persona_ids[0] if persona_ids else None
        )
        for role, content, thumbnails in messages:
            store.append(thread, role, content, thumbnails=thumbnails)
        for name, value in chat_settings.items():
            if value is not None:
                store.set_setting(thread, name, value)
        store.archive(thread, archived)


def without_time(data: bytes) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(data)
    del document["exported_at"]
    return document


@settings(max_examples=25)
@given(chats=CHATS, personas=st.lists(st.text(min_size=1, max_size=20), max_size=3))
def test_an_export_imported_elsewhere_reproduces_the_profile(
    make_store: StoreFactory, chats: list[Any], personas: list[str]
) -> None:
    source, target = make_store("source"), make_store("target")
    fill(source, chats, personas)
    exported = export_profile(source.replica, "default")
    report = import_export(target.replica, decode(exported), profile="default")
    assert not report.differing and not report.identical
    assert without_time(export_profile(target.replica, "default")) == without_time(exported)
    for chat in source.chats(archived=True) + source.chats():
        copied = target.chat(chat.id)
        assert copied is not None and copied.thread == chat.thread
        assert [m.message for m in target.messages(chat.id, limit=100).messages] == [
            m.message for m in source.messages(chat.id, limit=100).messages
        ]
        assert target.settings(chat.id) == source.settings(chat.id)
    assert target.personas() == source.personas()
    assert target.active_persona() == source.active_persona()


def test_an_import_never_replaces_and_twice_changes_nothing(make_store: StoreFactory) -> None:
    source, target = make_store("source"), make_store("target")
    kept, changed = a_chat(source, 2, "kept"), a_chat(source, 1, "changed here")
    exported = decode(export_profile(source.replica, "default"))
    import_export(target.replica, exported, profile="default")
    target.rename(changed, "renamed on the target")
    first_message = target.messages(kept, limit=10).messages[0].id
    target.edit(kept, first_message, "edited on the target")
    before = dump_of(target)
    report = import_export(target.replica, exported, profile="default")
    assert sorted(report.differing) == sorted([f"message {first_message}", f"thread {changed}"])
    assert report.identical == {"thread": 1, "message": 3}  # a differing chat's are left
    assert report.added == {} and dump_of(target) == before
    assert target.chat(changed).thread.title == "renamed on the target"  # type: ignore[union-attr]
    again = import_export(target.replica, exported, profile="default")
    assert again == report and dump_of(target) == before


def test_as_copies_imports_what_differs_under_new_ids_once(make_store: StoreFactory) -> None:
    source, target = make_store("source"), make_store("target")
    thread = a_chat(source, 1, "original")
    exported = decode(export_profile(source.replica, "default"))
    import_export(target.replica, exported, profile="default")
    target.rename(thread, "changed")
    report = import_export(target.replica, exported, profile="default", as_copies=True)
    assert report.copied == {"thread": 1} and report.added == {"message": 2}
    titles = sorted(c.thread.title for c in target.chats())
    assert titles == ["changed", "original"]
    (copy,) = [c for c in target.chats() if c.thread.title == "original"]
    assert copy.id != thread and copy.id[:10] == thread[:10]
    assert [m.message.content for m in target.messages(copy.id, limit=10).messages] == ["q0", "a0"]
    twice = dump_of(target)
    import_export(target.replica, exported, profile="default", as_copies=True)
    assert dump_of(target) == twice


def test_a_deleted_record_here_is_not_brought_back(make_store: StoreFactory) -> None:
    source, target = make_store("source"), make_store("target")
    thread = a_chat(source, 1)
    exported = decode(export_profile(source.replica, "default"))
    import_export(target.replica, exported, profile="default")
    target.delete(thread)
    report = import_export(target.replica, exported, profile="default")
    assert f"thread {thread}" in report.differing and target.chat(thread) is None
    assert target.replica.get(THREADS, thread).deleted  # type: ignore[union-attr]
    assert all(r.deleted for r in target.replica.scan(MESSAGES, include_deleted=True))


def test_thumbnails_are_bytes_to_the_app_and_base64_in_the_file(make_store: StoreFactory) -> None:
    store = make_store("r")
    thread = store.new_chat("pictures")
    store.append(thread, "user", "look", thumbnails=[b"\x89PNG\r\n"])
    (message,) = store.messages(thread, limit=10).messages
    assert message.message.thumbnails == [b"\x89PNG\r\n"]
    stored = store.replica.get(MESSAGES, message.id)
    assert stored is not None and stored.document["thumbnails"] == ["iVBORw0K"]
    exported = json.loads(export_profile(store.replica, "default"))
    assert exported["threads"][0]["messages"][0]["thumbnails"] == ["iVBORw0K"]


def test_exports_follow_their_json_schema(make_store: StoreFactory) -> None:
    store = make_store("r")
    fill(store, [("a chat", [("user", "hi", [b"png"]), ("assistant", "hello", [])],
                  {"model": {"name": "small", "t": 0.5}}, False)], ["helper"])  # fmt: skip
    thread = store.chats()[0].id
    store.fork(thread, store.messages(thread, limit=10).messages[0].id)
    schema = json.loads((ROOT / "specs" / "export.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    for scope in (None, thread):
        exported = json.loads(export_profile(store.replica, "default", thread=scope))
        jsonschema.validate(exported, schema, cls=jsonschema.Draft202012Validator)
    broken = exported | {"threads": [exported["threads"][0] | {"title": 5}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema, cls=jsonschema.Draft202012Validator)


def test_one_chat_exports_alone(make_store: StoreFactory) -> None:
    store = make_store("r")
    one, _ = a_chat(store, 1, "one"), a_chat(store, 1, "other")
    store.create_persona("kept out")
    exported = json.loads(export_profile(store.replica, "default", thread=one))
    assert exported["scope"] == "chat" and exported["personas"] == []
    assert [t["title"] for t in exported["threads"]] == ["one"]
    with pytest.raises(NoSuchChatError):
        export_profile(store.replica, "default", thread="01JDXQ00000000000000000000")
    with pytest.raises(InvalidArgumentError, match="no profile"):
        export_profile(store.replica, "nobody")


def dump_of(store: ChatStore) -> list[str]:
    """The store's file, as SQL (its own handle's writes committed)."""
    return dump(store.replica.path)


def test_an_export_imports_into_another_account(make_store: StoreFactory, tmp_path: Path) -> None:
    """A fresh account (its own keys, its own passphrase) takes the export as it is."""
    source = make_store("source")
    fill(source, [("kept", [("user", "hello", [b"\x00\x01"])], {"model": "small"}, True)], ["p"])
    exported = export_profile(source.replica, "default")
    fresh, _ = Replica.create(
        tmp_path / "fresh.db", with_chat(SCHEMA), "a fresh account's passphrase"
    )
    with fresh:
        import_export(fresh, decode(exported), profile="default")
        assert without_time(export_profile(fresh, "default")) == without_time(exported)
