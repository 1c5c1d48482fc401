"""Import of untrusted files (chat/limits.py, chat/archive.py): every ceiling at max - 1, max
and max + 1; then a corpus of hostile files (deep nesting, huge strings and numbers, wrong
types, duplicate ids, invalid UTF-8, lone surrogates, zip bombs, path traversal, links), each
a clear error naming where and which bound, within a second, through `sealsync import`, with
the replica byte for byte as it was."""

from __future__ import annotations

import copy
import io
import json
import stat
import time
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from chat.limits import (
    MAX_DEPTH,
    MAX_MESSAGES_PER_THREAD,
    MAX_OPENINGS,
    MAX_STRING_CHARS,
    MAX_THREADS,
    ImportLimitError,
    decode,
)
from chat.models import MAX_PERSONAS, MAX_THUMBNAILS
from clients.cli.exchange import read_exports
from tests.clients.test_cli import Cli, dump
from tests.conftest import ReplicaFactory

CHAT = "01JDXQ0000000000000000CHAT"
Edit = Callable[[dict[str, Any]], None]


def chat_id(n: int) -> str:
    return f"01JDXQ{n:020d}"


def message(n: int, **fields: Any) -> dict[str, Any]:
    return {"id": chat_id(10**9 + n), "at": n + 1, "role": "user", "content": "hi",
            "turn": chat_id(10**9 + n), "thumbnails": [], "created_ms": 1} | fields  # fmt: skip


def thread(n: int = 0, messages: int = 1, **fields: Any) -> dict[str, Any]:
    return {"id": chat_id(n), "title": f"chat {n}", "created_ms": 1, "updated_ms": 1,
            "messages": [message(n * 10_000 + m) for m in range(messages)],
            "settings": {"model": "small"}} | fields  # fmt: skip


def export(threads: int = 1, personas: int = 0) -> dict[str, Any]:
    return {"sealsync_export": 1, "scope": "profile", "profile": "default",
            "exported_at": "2026-12-02T00:00:00+00:00", "active_persona": None,
            "personas": [{"id": chat_id(5 * 10**9 + p), "name": "p", "prompt": ""}
                         for p in range(personas)],
            "threads": [thread(n) for n in range(threads)]}  # fmt: skip


def encoded(value: Any) -> bytes:
    return json.dumps(value).encode()


@pytest.mark.parametrize(
    ("what", "bound", "make"),
    [
        ("threads", MAX_THREADS, lambda n: export(threads=n)),
        ("personas", MAX_PERSONAS, lambda n: export(personas=n)),
        ("messages", MAX_MESSAGES_PER_THREAD,
         lambda n: export() | {"threads": [thread(messages=n)]}),
        ("thumbnails", MAX_THUMBNAILS, lambda n: export() | {"threads": [thread(
            messages=0) | {"messages": [message(0, thumbnails=["AAAA"] * n)]}]}),
    ],
)  # fmt: skip
def test_each_ceiling_at_its_bound_and_past_it(
    what: str, bound: int, make: Callable[[int], dict[str, Any]]
) -> None:
    for n in (bound - 1, bound):
        decode(encoded(make(n)))
    started = time.perf_counter()
    with pytest.raises(ImportLimitError, match=rf"{bound + 1:,} items \(bound {bound:,}\)"):
        decode(encoded(make(bound + 1)))
    assert time.perf_counter() - started < 1.0


def test_brackets_in_strings_are_not_counted_as_lists() -> None:
    code = "[" * (MAX_STRING_CHARS - 1) + "]"  # a message of code, at the bound of a string
    value = export() | {"threads": [thread(messages=0) | {"messages": [
        message(n, content=code) for n in range(MAX_OPENINGS // MAX_STRING_CHARS + 2)]}]}  # fmt: skip
    data = encoded(value)
    assert data.count(b"[") > MAX_OPENINGS
    started = time.perf_counter()
    assert len(decode(data).threads[0].messages) == MAX_OPENINGS // MAX_STRING_CHARS + 2
    assert time.perf_counter() - started < 1.0


def nest(depth: int) -> Any:
    value: Any = "deep"
    for _ in range(depth):
        value = [value]
    return value


def edited(edit: Edit) -> bytes:
    value = export(threads=2)
    edit(value)
    return encoded(value)


def first_thread(**fields: Any) -> Edit:
    return lambda value: value["threads"][0].update(fields)


def zipped(*entries: tuple[str, bytes], mode: int | None = None) -> bytes:
    buffer = io.BytesIO()
    with (
        warnings.catch_warnings(),  # a name twice is what a test wants
        zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive,
    ):
        warnings.simplefilter("ignore")
        for name, data in entries:
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            if mode is not None:
                info.external_attr = mode << 16
            archive.writestr(info, data)
    return buffer.getvalue()


GOOD = encoded(export())


def _changed_at(data: bytes, offset: int, value: int) -> bytes:
    changed = bytearray(data)
    changed[offset] = value
    return bytes(changed)


GOOD_ZIP = zipped(("a.json", GOOD))
DAMAGED_DEFLATE = _changed_at(GOOD_ZIP, 30 + len("a.json"), 0xFF)  # a reserved block type
NEWER_ZIP = _changed_at(GOOD_ZIP, GOOD_ZIP.index(b"PK\x01\x02") + 6, 0xFF)  # version 25.5
HUGE_NUMBER = GOOD.replace(b'"created_ms": 1', b'"created_ms": 1' + b"0" * 400, 1)
CORPUS: dict[str, tuple[bytes, str]] = {
    "deep nesting in a value": (
        edited(first_thread(settings={"x": nest(MAX_DEPTH + 1)})),
        rf"threads\[0\]\.settings\.x.*nested deeper than {MAX_DEPTH}",
    ),
    "deep nesting of the file": (b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
    "a huge title": (edited(first_thread(title="t" * 201)), r"threads\[0\]: .*title"),
    "a huge string": (edited(first_thread(note="x" * (256 * 1024 + 1))), r"threads\[0\]\.note"),
    "a huge number": (HUGE_NUMBER, r"threads\[0\]\.created_ms: an integer beyond"),
    "a number past what JSON can hold": (b'{"n": 1' + b"0" * 100_000 + b"}", "out of range"),
    "an integer past 2**63": (edited(first_thread(extra=2**63)), r"threads\[0\]\.extra: .*beyond"),
    "a title of the wrong type": (edited(first_thread(title=5)), r"threads\[0\]: .*title"),
    "messages of the wrong type": (edited(first_thread(messages={})), r"messages: not a list"),
    "thumbnails not base64": (
        edited(lambda v: v["threads"][0]["messages"][0].update(thumbnails=["not base64!"])),
        r"threads\[0\]\.messages\[0\]",
    ),
    "a chat's id twice": (
        edited(lambda v: v["threads"][1].update(id=v["threads"][0]["id"])),
        "threads: the id .* twice",
    ),
    "a message's id twice": (
        edited(lambda v: v["threads"][1]["messages"].append(v["threads"][0]["messages"][0])),
        "messages: the id .* twice",
    ),
    "an id that is no id": (edited(first_thread(id="../../etc")), r"threads\[0\]\.id"),
    "a persona that is no object": (
        edited(lambda v: v.update(personas=[1])),
        r"personas\[0\]: not an object",
    ),
    "a persona without an id": (
        edited(lambda v: v.update(personas=[{"name": "p"}])),
        r"personas\[0\]\.id",
    ),
    "a message that is no object": (
        edited(first_thread(messages=["hi"])),
        r"messages\[0\]: not an object",
    ),
    "a message without an id": (edited(first_thread(messages=[{"at": 1}])), r"messages\[0\]\.id"),
    "invalid UTF-8": (GOOD.replace(b'"chat 0"', b'"chat \xff"'), "not JSON in UTF-8"),
    "a lone surrogate": (GOOD.replace(b'"chat 0"', b'"chat \\ud800"'), "not JSON in UTF-8"),
    "not JSON": (b"{not json", "not JSON"),
    "another format": (encoded(export() | {"sealsync_export": 2}), "not a sealsync export"),
    "an unknown field": (encoded(export() | {"owner": "x"}), "owner: not a field"),
    "a zip bomb": (zipped(("a.json", b" " * 50_000_000)), "inflates past"),
    "a path out of the folder": (zipped(("../a.json", GOOD)), "not a plain file name"),
    "an absolute path": (zipped(("/tmp/a.json", GOOD)), "not a plain file name"),
    "a link": (zipped(("a.json", b"/etc/passwd"), mode=stat.S_IFLNK | 0o777), "a link"),
    "a name twice": (zipped(("a.json", GOOD), ("a.json", GOOD)), "named twice"),
    "not a zip": (b"PK\x03\x04 cut short", "not a zip archive"),
    "a damaged deflate stream": (DAMAGED_DEFLATE, "damaged"),
    "a zip of a newer version": (NEWER_ZIP, "not a zip archive|damaged"),
    "an active persona that is no id": (
        encoded(export() | {"active_persona": "nobody!"}),
        "active_persona",
    ),
    "sixteen megabytes of empty objects": (
        GOOD.replace(b'"threads": [', b'"threads": [' + b"{}," * 5_000_000, 1),
        r"the file: 5,000,\d{3} `{` and `\[` outside strings \(bound 1,500,000\)",
    ),
    "sixty-four megabytes of empty lists": (
        GOOD.replace(b'"threads": [', b'"threads": [' + b"[]," * 22_000_000, 1),
        r"the file: 22,000,\d{3} `{` and `\[` outside strings \(bound 1,500,000\)",
    ),
    "ten million lists of a string each": (
        GOOD.replace(b'"threads": [', b'"threads": [' + b'["a"],' * 10_000_000, 1),
        r"the file: 10,000,\d{3} `{` and `\[` and 20,000,\d{3} quotes \(bounds",
    ),
    "as many objects as may be decoded": (
        GOOD.replace(b'"threads": [', b'"threads": [' + b"{}," * (MAX_OPENINGS - 100), 1),
        r"threads: 1,499,90\d items \(bound 5,000\)",
    ),
}


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_a_hostile_file_is_a_clear_error_and_changes_nothing(
    case: str, cli: Cli, make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    data, expected = CORPUS[case]
    path = tmp_path / "import.json"
    path.write_bytes(data)
    started = time.perf_counter()
    with pytest.raises(ImportLimitError, match=expected):
        read_exports(path)
    assert time.perf_counter() - started < 1.0, case
    replica = make_replica()
    replica.close()
    before = dump(replica.path)
    result = cli(replica.path, "import", str(path))
    assert result.exit_code == 1 and "error:" in result.stderr, result.output
    assert "nothing was imported" in result.stderr and "Traceback" not in result.output
    assert dump(replica.path) == before


def test_a_good_file_and_a_zip_of_them_import(
    cli: Cli, make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    replica = make_replica()
    replica.close()
    path = tmp_path / "two.zip"
    other = copy.deepcopy(export())
    other["profile"] = "work"
    path.write_bytes(zipped(("a.json", GOOD), ("b.json", encoded(other))))
    done = cli.json_objects(replica.path, "import", str(path))
    assert [d["profile"] for d in done] == ["default", "work"]
    assert cli.ok(replica.path, "chat", "ls", "--profile", "work").stdout.count("chat 0") == 1
