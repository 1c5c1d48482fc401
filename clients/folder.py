"""`FolderSync`: a replica synced through a folder that a file-sync tool (Syncthing, Dropbox,
a NAS) keeps in step between devices, in place of a relay (specs/folder.md).

Each device writes only into its own place, `devices/NODE/`, and only whole files: each is
written under a hidden temporary name, fsynced, and renamed into place, never changed
again, so no file ever has two writers. A round writes this device's dirty versions as new
segments, then reads every other device's files it has not merged yet, and every so often
writes a snapshot of all it holds and removes its own older files (a device added later, or
one that was away long, catches up from snapshots). A reader merges a file only when it
opens (replica/folder.py: whole, signed by the account, in its place); one that does not is
left for the next round, as a file still arriving would be, and named. Conflict copies a
file-sync tool makes are opened and merged like the files they copy. What has been merged
is recorded beside the replica after the merge commits: a crash re-merges, which changes
nothing.
"""

from __future__ import annotations

import enum
import fcntl
import json
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from clients.device import (
    FILE_MODE,
    FOLDER_LOCK_SUFFIX,
    FOLDER_STATE_SUFFIX,
    fsync_folder,
    read_sidecar,
    write_atomically,
)
from replica import (
    DEFAULT_BATCH_BYTES,
    FileBody,
    FolderSession,
    Merged,
    ProtocolError,
    Replica,
)
from replica.errors import NewerKeysError, RetiredKeysError, StoreError
from replica.folder import DEVICE_PATTERN, MAX_FILE_BYTES, Kind, bundle_name

MARKER = "sealsync-folder.json"
"""Written once, by `init --folder`: what makes a folder a sealsync folder."""
FOLDER_FORMAT = 1
DEVICES = "devices"
KEYS = "keys"
SNAPSHOT_EVERY = 32
"""Own segments after which a round writes a snapshot and removes the files before it."""
MAX_BUNDLE_BYTES = 1024 * 1024
"""A key bundle file larger than this is no bundle (one is about a kilobyte), and not read."""
_FILE = re.compile(r"(segment|snapshot)-([0-9]{12})(.*)\.(seg|snap)")
_BUNDLE = re.compile(r"bundle-([0-9]{6})\.bin")
_DEVICE = re.compile(DEVICE_PATTERN)
_EXTENSION = {"segment": "seg", "snapshot": "snap"}


class Retired(enum.Enum):
    """A folder file signed under retired keys: seen, and never read."""

    RETIRED = enum.auto()


RETIRED = Retired.RETIRED


@dataclass(frozen=True)
class FolderFile:
    path: Path
    kind: Kind
    number: int
    copy: bool
    """A conflict copy a file-sync tool made (`NAME.sync-conflict-…`, `NAME (… conflicted
    copy …)`): opened and merged like the file it copies."""


def file_name(kind: Kind, number: int) -> str:
    return f"{kind}-{number:012d}.{_EXTENSION[kind]}"


def parse_file_name(path: Path) -> FolderFile | None:
    """The folder file `path` names, or None for any other name (temporary files begin
    with a dot, and match nothing)."""
    match = _FILE.fullmatch(path.name)
    if match is None or _EXTENSION[match[1]] != match[4]:
        return None
    kind: Kind = "segment" if match[1] == "segment" else "snapshot"
    return FolderFile(path, kind, int(match[2]), copy=match[3] != "")


@dataclass
class FolderState:
    """What this device has merged of each other device's files: all up to `done[device]`,
    and the numbers in `above[device]` beyond it; `copies`, the conflict copies merged."""

    folder: str
    done: dict[str, int] = field(default_factory=dict)
    above: dict[str, list[int]] = field(default_factory=dict)
    copies: list[str] = field(default_factory=list)
    generation: int = 0
    """The key generation all this was merged under: a device that takes newer keys reads
    the folder anew, so nothing a file of retired keys said (a snapshot's `covers`) holds."""


def state_path(replica_path: Path) -> Path:
    return replica_path.with_name(replica_path.name + FOLDER_STATE_SUFFIX)


def load_state(replica_path: Path) -> FolderState | None:
    return read_sidecar(
        state_path(replica_path),
        FolderState,
        "this device's folder state",
        hint="remove it and sync again with --folder: the folder's files are merged again",
    )


def save_state(replica_path: Path, state: FolderState) -> None:
    write_atomically(state_path(replica_path), json.dumps(asdict(state), sort_keys=True).encode())


def forget_merged(replica_path: Path) -> None:
    """Read every file of the folder again: a replica put in place of another (a restored
    backup) merged none of what that one had, and a repaired one set aside versions their
    files still hold. The state keeps the folder and forgets the rest (so its snapshots
    never claim to cover what it lacks)."""
    try:
        state = load_state(replica_path)
    except StoreError:
        state_path(replica_path).unlink()
        return
    if state is not None:
        save_state(replica_path, FolderState(state.folder))


def check_folder(folder: Path) -> None:
    """`StoreError` unless `folder` is a sealsync folder (`init --folder` made it)."""
    try:
        marker = json.loads((folder / MARKER).read_bytes())
    except FileNotFoundError:
        raise StoreError(
            f"{folder} is not a sealsync folder (no {MARKER})",
            hint="give the folder `sealsync init --folder` made, once the file-sync tool "
            "brought it here",
        ) from None
    except ValueError as exc:
        raise StoreError(f"{folder / MARKER} is damaged: {exc}") from None
    if marker != {"sealsync_folder": FOLDER_FORMAT}:
        raise StoreError(f"{folder} is a sealsync folder of another format: {marker}")


def make_folder(folder: Path, bundle: bytes, generation: int) -> None:
    """Make `folder` a sealsync folder holding the account's key bundle; refuses a folder
    that already is one, or holds anything (a sealsync folder whose marker has not arrived
    yet, perhaps): hidden names aside, such as a file-sync tool's own `.stfolder`."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if (folder / MARKER).exists():
        raise StoreError(
            f"{folder} is a sealsync folder already",
            hint="join it with `sealsync join --folder`, or give an empty folder",
        )
    if any(not path.name.startswith(".") for path in folder.iterdir()):
        raise StoreError(
            f"{folder} is not empty", hint="give an empty folder (or wait for the file-sync tool)"
        )
    (folder / KEYS).mkdir(mode=0o700, exist_ok=True)
    (folder / DEVICES).mkdir(mode=0o700, exist_ok=True)
    write_atomically(folder / KEYS / bundle_name(generation), bundle, over=False)
    write_atomically(folder / MARKER, json.dumps({"sealsync_folder": FOLDER_FORMAT}).encode())
    fsync_folder(folder)


def read_bundles(folder: Path) -> dict[int, bytes]:
    """The key bundles in `folder`, by generation (one immutable file per generation; a
    conflict copy of one is no bundle, nor is a file too large to be one)."""
    found: dict[int, bytes] = {}
    if not (folder / KEYS).is_dir():  # not synced here yet: no bundle, no chain
        return found
    for path in (folder / KEYS).iterdir():
        match = _BUNDLE.fullmatch(path.name)
        try:
            if match is not None and path.stat().st_size <= MAX_BUNDLE_BYTES:
                found[int(match[1])] = path.read_bytes()
        except OSError:  # removed meanwhile, or not readable: no bundle of the chain
            continue
    return found


def read_bundle(folder: Path) -> bytes:
    """The newest key bundle in `folder` (join's: the passphrase then says if it is this
    account's)."""
    check_folder(folder)
    bundles = read_bundles(folder)
    if not bundles:
        raise StoreError(f"{folder} holds no key bundle", hint="is the folder synced here yet?")
    return bundles[max(bundles)]


@dataclass
class FolderReport:
    """One round: segments written and the versions in them, files merged and what merging
    them did, files that did not open (named, with why), and the snapshot written."""

    segments: int = 0
    pushed: int = 0
    files: int = 0
    merged: Merged = field(default_factory=Merged)
    refused: list[str] = field(default_factory=list)
    snapshot: str | None = None
    newer_keys: bytes | None = None
    """The folder's newer key bundle, when another device changed the keys: this device
    neither writes nor reads until it takes them (`Replica.adopt_bundle`, with the new
    passphrase)."""
    waiting: int = 0
    """Files signed under newer keys whose bundle has not reached this copy of the folder:
    read once it has, and this device took them."""
    retired: int = 0
    """Files signed under keys a rotation retired: never read (a revoked device's, or ones
    their device writes again under the new keys once it takes them)."""


class FolderSync:
    """Sync one unlocked replica through `folder` (a round: `sync()`)."""

    def __init__(
        self,
        replica: Replica,
        folder: Path,
        *,
        snapshot_every: int = SNAPSHOT_EVERY,
        max_batch_bytes: int = DEFAULT_BATCH_BYTES,
    ) -> None:
        check_folder(folder)
        self.replica = replica
        self.folder = folder
        self.snapshot_every = snapshot_every
        self.session: FolderSession = replica.folder_session(max_batch_bytes=max_batch_bytes)
        self.device = self.session.device
        self.own = folder / DEVICES / self.device
        state = load_state(replica.path)
        self.state = state if state is not None and state.folder == str(folder) else None

    def sync(self) -> FolderReport:
        """Write this device's changes, then merge the others'; a snapshot when due."""
        report = FolderReport()
        with one_round_at_a_time(self.replica.path):
            check_folder(self.folder)  # every round: a folder whose disk went away is no folder
            state = self.state or FolderState(str(self.folder))
            if state.generation != self.replica.key_generation:
                state = FolderState(str(self.folder), generation=self.replica.key_generation)
            (self.folder / DEVICES).mkdir(mode=0o700, exist_ok=True)
            self.own.mkdir(mode=0o700, exist_ok=True)
            self.session.restart()  # every dirty version is offered again, whatever its row
            self._remove_own_temporaries()
            keys = self.session.take_bundles(read_bundles(self.folder))
            report.newer_keys = keys.newer
            report.refused.extend(keys.problems)
            if report.newer_keys is None:  # else its keys are retired: it neither writes what
                self._write_segments(report)  # the others would not read, nor reads what a
                self._merge_others(state, report)  # revoked device may have written
                self._snapshot_when_due(state, report)
            save_state(self.replica.path, state)
            self.state = state
        return report

    # -- this device's files --------------------------------------------------------------------

    def _own_files(self) -> list[FolderFile]:
        files = (parse_file_name(p) for p in self.own.iterdir())
        return sorted((f for f in files if f is not None and not f.copy), key=lambda f: f.number)

    def _remove_own_temporaries(self) -> None:
        """A write cut short leaves its temporary file: no reader ever opens one."""
        for path in self.own.glob(".*.tmp"):
            path.unlink(missing_ok=True)

    def _write_segments(self, report: FolderReport) -> None:
        own = self._own_files()
        number = own[-1].number + 1 if own else 1
        while (sealed := self.session.next_segment(number)) is not None:
            write_atomically(self.own / file_name("segment", number), sealed.data, over=False)
            self.session.written(sealed)
            report.segments += 1
            report.pushed += len(sealed.batch.envelopes)
            number += 1

    def _snapshot_when_due(self, state: FolderState, report: FolderReport) -> None:
        own = self._own_files()
        since = [f for f in own if f.kind == "segment" and f.number > _last_snapshot(own)]
        if len(since) < self.snapshot_every:
            return
        number = own[-1].number + 1
        name = file_name("snapshot", number)
        try:
            data = self.session.snapshot(number, dict(state.done))
        except ProtocolError as exc:  # no snapshot: the segments stay, nothing is lost
            report.refused.append(f"{DEVICES}/{self.device}/{name} not written: {exc}")
            return
        write_atomically(self.own / name, data, over=False)
        for path in self.own.iterdir():  # the files before it, and copies of them
            parsed = parse_file_name(path)
            if parsed is not None and parsed.number < number:
                path.unlink(missing_ok=True)
        fsync_folder(self.own)
        report.snapshot = name

    # -- the other devices' files ---------------------------------------------------------------

    def _merge_others(self, state: FolderState, report: FolderReport) -> None:
        devices = self.folder / DEVICES
        for place in sorted(devices.iterdir()):
            if place.name != self.device and _DEVICE.fullmatch(place.name) and place.is_dir():
                self._merge_device(place, state, report)
        state.copies = [n for n in state.copies if (devices / n).exists()]  # gone: forgotten

    def _merge_device(self, place: Path, state: FolderState, report: FolderReport) -> None:
        device = place.name
        files = [f for f in map(parse_file_name, place.iterdir()) if f is not None]
        done = state.done.get(device, 0)
        above = set(state.above.get(device, []))
        snapshots = [f for f in files if f.kind == "snapshot" and not f.copy and f.number > done]
        newest = max(snapshots, key=lambda f: f.number, default=None)
        body = None if newest is None else self._open(newest, device, report)
        if newest is not None and isinstance(body, FileBody):
            self._merge(body, report)
            done = max(done, newest.number)
            for other, covered in body.covers.items():
                if other != self.device:
                    state.done[other] = max(state.done.get(other, 0), covered)
        elif newest is not None and body is RETIRED:
            above.add(newest.number)
        for file in sorted(files, key=lambda f: f.number):
            name = f"{device}/{file.path.name}"
            seen = (
                name in state.copies if file.copy else (file.number <= done or file.number in above)
            )
            if seen:
                continue
            if (body := self._open(file, device, report)) is None:
                continue
            if body is not RETIRED:  # never to be read: seen
                self._merge(body, report)
            if file.copy:
                state.copies.append(name)
            else:
                above.add(file.number)
        while done + 1 in above:
            done += 1
            above.discard(done)
        state.done[device] = max(done, state.done.get(device, 0))
        state.above[device] = sorted(n for n in above if n > state.done[device])

    def _open(
        self, file: FolderFile, device: str, report: FolderReport
    ) -> FileBody | Retired | None:
        """The file's body; None (named in the report) when it does not open yet; `RETIRED`
        (counted) when it never will, being signed under retired keys."""
        place = f"{DEVICES}/{device}/{file.path.name}"
        try:
            found = file.path.stat()
            if not stat.S_ISREG(found.st_mode):  # a folder, a FIFO: never opened
                report.refused.append(f"{place}: not a regular file")
                return None
            if found.st_size > MAX_FILE_BYTES:  # never read into memory
                report.refused.append(f"{place}: {found.st_size:,} bytes, above {MAX_FILE_BYTES:,}")
                return None
            data = file.path.read_bytes()
        except FileNotFoundError:  # removed meanwhile: a snapshot covers it now
            return None
        except OSError as exc:  # one file this user cannot read holds up no other
            report.refused.append(f"{place}: {exc.strerror or exc}")
            return None
        try:
            return self.session.open(data, device, file.number, file.kind)
        except NewerKeysError:
            report.waiting += 1
            return None
        except RetiredKeysError:
            report.retired += 1
            return RETIRED
        except ProtocolError as exc:
            report.refused.append(f"{place}: {exc}")
            return None

    def _merge(self, body: FileBody, report: FolderReport) -> None:
        report.merged.add(self.session.merge(body))
        report.files += 1


@contextmanager
def one_round_at_a_time(replica_path: Path) -> Iterator[None]:
    """Rounds on one replica file take turns, across processes: an OS lock on a file beside
    it, which the OS lets go of however its holder ends (a round killed midway never holds
    the next one back)."""
    lock = replica_path.with_name(replica_path.name + FOLDER_LOCK_SUFFIX)
    descriptor = os.open(lock, os.O_CREAT | os.O_RDWR, FILE_MODE)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _last_snapshot(own: list[FolderFile]) -> int:
    return max((f.number for f in own if f.kind == "snapshot"), default=0)
