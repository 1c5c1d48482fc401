"""A replica file copied whole, as ciphertext, into a folder of backups, and put back.

A backup is one consistent snapshot taken through SQLite's online backup API, so it is whole
even while another process writes; it needs no passphrase (the file holds only ciphertext and
the passphrase-wrapped key bundle). Both commands write to a temporary name in the target's
folder and rename it into place, so a crash never leaves a partial file under the real name.
A restored replica takes a new node id: the device it came from may still be writing as the
old one, and two files writing as one node would give different versions one identity.
Device-local records (the `local` policy, such as drafts) are left out of a backup
(`replica.snapshot`). Each backup has a manifest beside it (`clients/manifest.py`), and a
backup that does not verify (`clients/verify.py`) is restored only when forced.
"""

from __future__ import annotations

import datetime
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from clients.device import FILE_MODE, fsync_folder
from clients.folder import forget_merged
from clients.manifest import (
    Manifest,
    describe,
    manifest_path,
    read_manifest,
    taken_at,
    write_manifest,
)
from clients.retention import KeepPolicy, kept
from clients.rowdigests import ROWS_SUFFIX, rows_path
from clients.verify import Verdict, verify_backup
from replica import Merged, Replica, backup_replica_file, copy_replica_file
from replica.errors import StoreError
from replica.transfers import ProfileBackup

SIDE_FILES = ("-wal", "-shm", "-journal")
OnCopied = Callable[[int, int], None]
"""Told (pages copied, pages in all) as a copy goes."""


@contextmanager
def temp_beside(target: Path) -> Iterator[Path]:
    """A new, empty, owner-only file next to `target`; removed (with SQLite's side files)
    unless the caller renamed it into place."""
    descriptor, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.fchmod(descriptor, FILE_MODE)
    os.close(descriptor)
    temp = Path(name)
    try:
        yield temp
    finally:
        for suffix in ("", *SIDE_FILES, ROWS_SUFFIX):
            Path(name + suffix).unlink(missing_ok=True)


@dataclass(frozen=True)
class BackupScope:
    """What a backup holds: every profile (`ALL`), or one (`Replica.profile_scopes`)."""

    name: str
    keep: ProfileBackup | None = None


ALL = BackupScope("all")


def profile_scope(replica: Replica, profile: str) -> BackupScope:
    """The scope of a backup of `profile` (the replica unlocked); an error if no such one."""
    if profile not in replica.profiles():
        raise StoreError(f"no profile {profile!r}", hint="`sealsync profiles` lists them")
    keep = replica.profile_scopes(profile)
    return BackupScope(f"profile-{keep.tag}", keep)


def backup_name(replica_path: Path, now: datetime.datetime, node: int, scope: str = "all") -> str:
    """What a backup is called: the replica (never hidden: names that begin with a dot are
    copies in progress), what it holds (`all`, or `profile-TAG`), when, and the node."""
    stem = replica_path.stem.lstrip(".") or "replica"
    return f"{stem}-{scope}-{now:%Y%m%dT%H%M%S%fZ}-{node:016x}.db"


def backup_replica(
    replica_path: Path,
    folder: Path,
    now: datetime.datetime,
    progress: OnCopied | None = None,
    scope: BackupScope = ALL,
) -> Path:
    """Snapshot the replica (or, by `scope`, one profile of it) into `folder` under a new
    name, its manifest written first (a crash leaves a manifest without its backup, never a
    backup that looks cut short); returns the backup's path."""
    written = _backup(replica_path, folder, now, progress, scope, skip_unchanged=False)
    assert written is not None, "only a backup that may be skipped is"
    return written


def backup_if_changed(replica_path: Path, folder: Path, now: datetime.datetime) -> Path | None:
    """`backup_replica`, unless the replica's node has a good backup in `folder` holding the
    same rows and key bundle: then nothing is written, and None returned."""
    return _backup(replica_path, folder, now, None, ALL, skip_unchanged=True)


def _backup(
    replica_path: Path,
    folder: Path,
    now: datetime.datetime,
    progress: OnCopied | None,
    scope: BackupScope,
    *,
    skip_unchanged: bool,
) -> Path | None:
    with Replica.open(replica_path) as source:  # a replica, or a clear error before anything
        node = source.node
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = folder / backup_name(replica_path, now, node, scope.name)
    if target.exists():
        raise StoreError(f"{target} already exists", hint="run `sealsync backup` again")
    with disk_errors(target), temp_beside(target) as temp:
        backup_replica_file(replica_path, temp, keep=scope.keep, progress=progress)
        digests = Path(f"{temp}{ROWS_SUFFIX}")  # removed with the temporary file
        manifest = describe(temp, target.name, node, now, scope.name, digests_to=digests)
        newest = newest_good_manifest(folder, manifest.node, scope) if skip_unchanged else None
        if newest is not None and newest.same_content(manifest):
            return None
        try:
            os.replace(digests, rows_path(target))  # then the manifest, then the backup
            write_manifest(manifest, manifest_path(target))
            os.link(temp, target)  # never over another backup of the same name
        except FileExistsError:
            raise StoreError(
                f"{target} already exists", hint="run `sealsync backup` again"
            ) from None
        except BaseException:  # a failed backup leaves none of its files (a crash may)
            for beside in (rows_path(target), manifest_path(target)):
                beside.unlink(missing_ok=True)
            raise
        fsync_folder(folder)
    return target


@contextmanager
def disk_errors(target: Path) -> Iterator[None]:
    """A disk that failed or filled up while `target` was written, as `StoreError`. What
    was there before stays whole; so does the new file if it had taken its place (only the
    folder's sync failed), but whether that lasts a power cut is unknown."""
    try:
        yield
    except OSError as exc:
        raise StoreError(
            f"{target}: the disk refused a write or a sync ({exc.strerror or exc})",
            hint="check the disk (free space, errors in the system log), then try again",
        ) from exc


def newest_good_manifest(folder: Path, node: str, scope: BackupScope) -> Manifest | None:
    """The manifest of the newest backup of `node` and `scope` in `folder`, if that backup
    verifies."""
    taken = []
    for path in folder.glob(f"*-{scope.name}-*-{node}.db"):
        try:
            manifest = read_manifest(manifest_path(path))
            if manifest.scope == scope.name:
                taken.append((taken_at(manifest, path), path, manifest))
        except (OSError, StoreError):
            continue
    if not taken:
        return None
    _, path, manifest = max(taken, key=lambda t: (t[0], t[1].name))
    return manifest if verify_backup(path).state == "ok" else None


@dataclass(frozen=True)
class ListedBackup:
    name: str
    bytes: int
    taken_ms: int
    """From the manifest; the file's time when it has none."""
    manifest: bool


def list_backups(folder: Path) -> list[ListedBackup]:
    """The backups in `folder`, oldest first (`verify` says whether they are good)."""
    if not folder.is_dir():
        raise StoreError(f"no folder {folder}", hint="give the folder given to `backup --to`")
    listed = []
    for path in folder.glob("*.db"):
        stat = path.stat()
        taken_ms = stat.st_mtime_ns // 1_000_000
        try:
            taken = taken_at(read_manifest(manifest_path(path)), manifest_path(path))
            taken_ms, has_manifest = int(taken.timestamp() * 1000), True
        except (OSError, StoreError):
            has_manifest = False
        listed.append(ListedBackup(path.name, stat.st_size, taken_ms, has_manifest))
    return sorted(listed, key=lambda b: (b.taken_ms, b.name))


@dataclass(frozen=True)
class Forgotten:
    """What `forget_backups` kept and removed, and the backups it left alone (they do not
    verify: they neither count as kept nor are removed)."""

    kept: list[str]
    removed: list[str]
    left_alone: list[str]


def forget_backups(folder: Path, policy: KeepPolicy, *, dry_run: bool) -> Forgotten:
    """Remove the backups in `folder` that `policy` does not keep (clients/retention.py), the
    rules applied to each node's backups of each scope apart (restic's groups by host and
    paths: one replica's backups, or one profile's, never push another's out), among those
    that verify: a backup that does not is never counted, so a failed backup can never push
    a good one out."""
    if policy.empty:
        raise StoreError(
            "forget needs a rule, or it would keep everything",
            hint="give --keep-last, --keep-daily, --keep-weekly or --keep-monthly",
        )
    groups: dict[tuple[str, str], list[tuple[Path, datetime.datetime]]] = {}
    left_alone = []
    for path in sorted(folder.glob("*.db")):
        if verify_backup(path).state != "ok":
            left_alone.append(path.name)
            continue
        manifest = read_manifest(manifest_path(path))
        group = (manifest.node, manifest.scope)
        groups.setdefault(group, []).append((path, taken_at(manifest, path)))
    kept_paths: list[Path] = []
    removed: list[Path] = []
    for backups in groups.values():
        keep = kept([taken for _, taken in backups], policy)
        for (path, _), k in zip(backups, keep, strict=True):
            (kept_paths if k else removed).append(path)
    if not dry_run:
        for path in removed:  # the backup first: a crash leaves its manifest, which verify names
            path.unlink(missing_ok=True)  # another forget may have been first
            manifest_path(path).unlink(missing_ok=True)
            rows_path(path).unlink(missing_ok=True)
        fsync_folder(folder)
    return Forgotten(
        sorted(p.name for p in kept_paths), sorted(p.name for p in removed), left_alone
    )


def restore_replica(
    backup: Path,
    replica_path: Path,
    *,
    force: bool,
    unverified: bool = False,
    progress: OnCopied | None = None,
    passphrase: Callable[[], str] | None = None,
) -> tuple[int, Verdict]:
    """Copy `backup` to `replica_path` with a new node id: the id, and what verifying the
    backup found. A backup that does not verify is restored only `unverified`; an existing
    replica is replaced only with `force`, and, given its `passphrase`, only by a backup of
    its own account."""
    verdict = _verified(backup, unverified)
    if replica_path.exists() and force and passphrase is not None:
        _refuse_another_account(replica_path, backup, passphrase)
    if replica_path.exists() and not force:
        raise StoreError(
            f"{replica_path} already exists",
            hint="give --merge to merge the backup into it, --force to replace it (changes "
            "not synced yet are lost), or another --replica path",
        )
    replica_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with disk_errors(replica_path), temp_beside(replica_path) as temp:
        copy_replica_file(backup, temp, read_only=True, progress=progress)
        with Replica.open(temp) as restored:  # refuses what is not a replica
            node = restored.take_new_node_id()
        for suffix in SIDE_FILES:  # a stale WAL must never be replayed into the restored file
            replica_path.with_name(replica_path.name + suffix).unlink(missing_ok=True)
        os.replace(temp, replica_path)
        fsync_folder(replica_path.parent)
    forget_merged(replica_path)
    return node, verdict


def _refuse_another_account(
    replica_path: Path, backup: Path, passphrase: Callable[[], str]
) -> None:
    """Refuse to put another account's backup over `replica_path`. A file there that does
    not open as a replica (why it is restored, often) has no account to compare: it is
    replaced as `--force` says."""
    try:
        replica = Replica.open(replica_path)
    except StoreError:
        return
    with replica:
        replica.unlock(passphrase())
        replica.check_backup_account(backup)


def merge_backup_into(
    replica: Replica,
    backup: Path,
    *,
    profile: str | None = None,
    collection: str | None = None,
    unverified: bool = False,
    progress: OnCopied | None = None,
) -> tuple[Merged, Verdict]:
    """Merge `backup` into the unlocked `replica` as if pulled (`Replica.merge_backup`): what
    it did, and what verifying the backup found; one that does not verify only `unverified`."""
    verdict = _verified(backup, unverified)
    merged = replica.merge_backup(backup, profile=profile, collection=collection, progress=progress)
    return merged, verdict


def _verified(backup: Path, unverified: bool) -> Verdict:
    """What `verify_backup` says of `backup`; `StoreError` for a backup that does not verify,
    unless `unverified`, and for no backup at all."""
    if not backup.is_file():
        raise StoreError(f"no backup at {backup}", hint="give the path `sealsync backup` printed")
    verdict = verify_backup(backup)
    if verdict.state != "ok" and not unverified:
        raise StoreError(
            f"{backup} is {verdict.state}: {'; '.join(verdict.problems)}",
            hint="restore another backup (`sealsync backup verify FOLDER`), or give "
            "--unverified to restore this one as it is",
        )
    return verdict
