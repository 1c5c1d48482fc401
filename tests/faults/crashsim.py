"""Power cuts simulated by record and replay (issue 15, item 2), after SQLite's test6.c.

`strace` logs every system call a child makes on the replica's files, with the bytes it
wrote. `replay` walks that log and, at each cut point (before each call), builds what a disk
would hold after a power cut there: for each file, everything written before its last
`fsync`/`fdatasync`, plus the writes since, which a cut treats by `Mode`:

- `drop`: lost (the disk's cache never reached the platter);
- `keep`: all there (only the process died);
- `torn`: each 512-byte sector written since the sync independently there, not there, or
  garbage (a sector half written when the power went).

Creating and removing a file count at once: SQLite syncs the folder after it creates its
log, and removes the log only once the database file holds all of it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

SECTOR = 512
CALLS = "openat,write,pwrite64,ftruncate,fsync,fdatasync,unlink,unlinkat,rename,renameat2"
"""What the recording traces: strace's `-e trace=` list (no `-f`: the child writes from
one thread; a call this module does not model fails the replay rather than pass unseen)."""

_LINE = re.compile(r"^(?P<call>\w+)\((?P<args>.*)\) += (?P<result>-?\d+)")
_FD = re.compile(r"^\d+<(?P<path>(?:\\x[0-9a-f]{2})*)>")
_STRING = re.compile(r'"((?:\\x[0-9a-f]{2})*)"')


class Mode(Enum):
    DROP = "drop"
    KEEP = "keep"
    TORN = "torn"


@dataclass(frozen=True)
class Call:
    """One system call of the recording, on a traced file or the child's standard output."""

    name: str
    path: str
    data: bytes = b""
    offset: int = 0
    size: int = 0


@dataclass
class FileState:
    """A file as the disk holds it for sure (`durable`) and as the process sees it."""

    durable: bytearray = field(default_factory=bytearray)
    pending: list[Call] = field(default_factory=list)
    """Writes and truncations since the last sync, in order."""

    def apply(self, call: Call) -> None:
        self.pending.append(call)

    def sync(self) -> None:
        self.durable = self.image(Mode.KEEP, random.Random(0))
        self.pending = []

    def image(self, mode: Mode, rng: random.Random) -> bytearray:
        content = bytearray(self.durable)
        if mode is Mode.DROP:
            return content
        for call in self.pending:
            if call.name == "ftruncate":
                if mode is Mode.KEEP or rng.random() < 0.5:
                    del content[call.size :]
                    content.extend(bytes(max(0, call.size - len(content))))
            else:
                _write(content, call, mode, rng)
        return content


def _write(content: bytearray, call: Call, mode: Mode, rng: random.Random) -> None:
    """`call`'s bytes into `content`: all of them, or (torn) sector by sector."""
    end = call.offset + len(call.data)
    pieces = [(call.offset, end)]
    if mode is Mode.TORN:
        first = call.offset // SECTOR * SECTOR
        pieces = [(max(s, call.offset), min(s + SECTOR, end)) for s in range(first, end, SECTOR)]
    for low, high in pieces:
        chunk = call.data[low - call.offset : high - call.offset]
        if mode is Mode.TORN:
            fate = rng.randrange(3)
            if fate == 0:
                continue
            if fate == 1:
                chunk = rng.randbytes(len(chunk))
        if len(content) < high:
            content.extend(bytes(high - len(content)))
        content[low:high] = chunk


def parse(log: str, traced: str) -> list[Call]:
    """The calls on files whose path starts with `traced` (but the shared-memory index,
    which SQLite rebuilds from the log), and the child's writes to standard output."""
    calls = []
    for line in log.splitlines():
        match = _LINE.match(line)
        if match is None or int(match["result"]) < 0:
            continue  # strace's notes, failed calls
        call = _call(match["call"], match["args"], traced)
        if call is not None:
            calls.append(call)
    return calls


def _call(name: str, args: str, traced: str) -> Call | None:
    if name in ("unlink", "unlinkat", "openat", "rename", "renameat2"):
        paths = [_decode(found).decode() for found in _STRING.findall(args)]
        wanted = [p for p in paths if p.startswith(traced) and not p.endswith("-shm")]
        if not wanted:
            return None
        if name.startswith("rename"):
            raise AssertionError(f"{name} of {wanted}: the replay does not model it")
        if name == "openat":
            return Call(name, wanted[0]) if "O_CREAT" in args else None
        return Call("unlink", wanted[0])
    fd = _FD.match(args)
    if fd is None:
        return None
    path = _decode(fd["path"]).decode()
    if name == "write" and args.startswith("1<"):
        return Call("stdout", path, _decode(_STRING.search(args)[1]))  # type: ignore[index]
    if not path.startswith(traced) or path.endswith("-shm"):
        return None
    if name == "pwrite64":
        data = _decode(_STRING.search(args)[1])  # type: ignore[index]
        return Call(name, path, data, offset=int(args.rsplit(",", 1)[1]))
    if name == "ftruncate":
        return Call(name, path, size=int(args.rsplit(",", 1)[1]))
    if name in ("fsync", "fdatasync"):
        return Call("sync", path)
    raise AssertionError(f"{name} on {path}: the replay does not model it")


def _decode(escaped: str) -> bytes:
    return bytes.fromhex(escaped.replace("\\x", ""))


@dataclass(frozen=True)
class CutPoint:
    """What the disk may hold after a cut before call `index`, and what the child had
    printed (its acknowledgements) by then."""

    index: int
    printed: tuple[str, ...]
    files: dict[str, bytes]


def replay(calls: list[Call], mode: Mode, seed: int = 0) -> Iterator[CutPoint]:
    """A crash image at every cut point of the recording, in order."""
    rng = random.Random(seed)
    files: dict[str, FileState] = {}
    printed = ""
    for index, call in enumerate(calls):
        images = {path: bytes(state.image(mode, rng)) for path, state in files.items()}
        yield CutPoint(index, tuple(printed.splitlines()), images)
        if call.name == "stdout":
            printed += call.data.decode()
        elif call.name == "openat":
            files.setdefault(call.path, FileState())
        elif call.name == "unlink":
            files.pop(call.path, None)
        elif call.name == "sync":
            files[call.path].sync()
        else:
            files.setdefault(call.path, FileState()).apply(call)


def write_image(cut: CutPoint, folder: Path, traced: str) -> None:
    """The cut's files into `folder`, under their names relative to the traced prefix."""
    for child in folder.iterdir():
        child.unlink()
    for path, content in cut.files.items():
        (folder / ("replica.db" + path[len(traced) :])).write_bytes(content)
