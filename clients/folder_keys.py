"""Changing an account's keys through its shared folder (specs/folder.md §4): a rotation,
revoking a device or retiring the old passphrase, becomes the next generation's bundle file
`keys/bundle-G.bin`, and the other devices take it at their next round with the new
passphrase.

A folder has no compare-and-set: the new bundle is linked into place, never over a file
there, and the local change commits only once it is. Two devices rotating at once in two
copies of the folder each succeed locally; the file-sync tool keeps one under the real name,
and the other device's next round says so (`FolderSession.take_bundles`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from clients.device import write_atomically
from clients.folder import DEVICES, KEYS, FolderReport, FolderSync, parse_file_name
from replica import Replica
from replica.bundles import generation_of, parse_bundle
from replica.errors import InvalidArgumentError, StoreError
from replica.folder import DEVICE_PATTERN, bundle_name

KEYS_CHANGED_HINT = "`sealsync sync` takes them (with the new passphrase); then run this again"


@dataclass(frozen=True)
class FolderDevice:
    """A device as the folder shows it: its place, its files there, and when it last wrote."""

    id: str
    files: int
    written_ms: int
    current: bool


def folder_devices(folder: Path, this_device: str) -> list[FolderDevice]:
    """Every device with a place in `folder`, by id (a revoked one too: nothing in a folder
    takes its place away, so the file-sync tool must)."""
    found = []
    places = folder / DEVICES
    for place in sorted(places.iterdir()) if places.is_dir() else []:
        if not place.is_dir() or re.fullmatch(DEVICE_PATTERN, place.name) is None:
            continue
        files = [p for p in place.iterdir() if parse_file_name(p) is not None]
        newest = max((p.stat().st_mtime_ns for p in files), default=0) // 1_000_000
        found.append(FolderDevice(place.name, len(files), newest, place.name == this_device))
    return found


def check_revocable_in_folder(folder: Path, this_device: str, device_id: str) -> None:
    """This device and ids with no place in the folder are refused before any passphrase."""
    if device_id == this_device:
        raise InvalidArgumentError(
            f"{device_id!r} is this device", hint="revoke it from another device of the account"
        )
    if not any(d.id == device_id for d in folder_devices(folder, this_device)):
        raise InvalidArgumentError(
            f"no device {device_id!r} in folder {folder}",
            hint="`sealsync devices` lists their ids",
        )


def refuse_newer_keys(replica: Replica, report: FolderReport) -> None:
    """`StoreError` naming both generations when the round found newer keys in the folder:
    this device must take them before it changes the keys or leaves the folder."""
    if report.newer_keys is not None:
        theirs = generation_of(parse_bundle(report.newer_keys))
        raise StoreError(
            f"the folder holds key generation {theirs}, newer than this device's "
            f"{replica.key_generation} (changed on another device)",
            hint=KEYS_CHANGED_HINT,
        )


def rotate_in_folder(
    driver: FolderSync,
    new_passphrase: str,
    *,
    revoked: str | None,
    new_recovery_key: str | None = None,
) -> FolderReport:
    """Generation g + 1 of the unlocked replica's keys under `new_passphrase` (revoking
    `revoked`, if any), written to the folder; then a round writing every version held here
    under it (no reader reads a file of retired keys, so this carries what a device that
    never takes the new keys wrote before). A round comes first, so the frontier covers
    what the folder holds. A file in the next generation's place that does not follow
    (garbage, another account's) is set aside under a hidden name. `StoreError`, with
    nothing changed, when the folder holds a newer generation or gets one meanwhile."""
    replica = driver.replica
    refuse_newer_keys(replica, driver.sync())
    following = driver.folder / KEYS / bundle_name(replica.key_generation + 1)
    if following.exists():  # no bundle that follows this one (else newer_keys): set aside
        following.replace(following.with_name(f".{following.name}.refused"))
    with replica.batch():
        login = replica.rotate_keys(
            new_passphrase,
            revoked_device=revoked,
            device=driver.device,
            new_recovery_key=new_recovery_key,
            through_folder=True,
        )
        try:
            write_atomically(following, replica.key_bundle(), over=False)
        except FileExistsError:
            raise StoreError(
                f"another device wrote {following.name} meanwhile: it changed the keys",
                hint=KEYS_CHANGED_HINT,
            ) from None
    replica.unlock_with_login_keys(login)
    replica.sync_session().reseed()  # what the others read only under the retired keys
    return driver.sync()
