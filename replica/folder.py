"""Sync through a shared folder, sans I/O: the signed files a device writes into its own
place in the folder, and what it merges from the others' (specs/folder.md).

Nothing in a folder checks anything for a device, so each file is signed with the
account's signing key and every reader verifies it before reading one envelope: a forged,
unsigned, cut-short or half-synced file is refused, never merged. A *segment* carries the
versions a device had not written out yet (its dirty versions, cleared once the file is
durable in the folder: `written`); a *snapshot* carries every current version the device
holds, and the segments of each device it covers, so a device added later, or one whose
segments were compacted away, catches up from it. What a file holds is merged like a pulled
page (replica/outside.py): nothing newer is replaced, every rule for inbound versions holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from replica.bundles import parse_bundle
from replica.envelope import open_envelope
from replica.errors import (
    EnvelopeError,
    InvalidArgumentError,
    NewerKeysError,
    ProtocolError,
    RetiredKeysError,
    UnknownEpochError,
)
from replica.generations import KeyBundleV2, verify_chain
from replica.outside import Merged, merge_outside
from replica.sync import SyncSession
from replica.wire import MAX_HLC, PushBatch, Signature, parse_header

if TYPE_CHECKING:
    from replica.core import Core

FOLDER_FORMAT = 1
SIGNED_LABEL = b"sealsync folder file v1\x00"
"""Prefixes the signed bytes: a folder file's signature is never a push's, nor the reverse."""
MAX_FILE_BYTES = 256 * 1024 * 1024
"""The largest folder file a device reads (a snapshot of every version it holds)."""
Kind = Literal["segment", "snapshot"]
Number = Annotated[int, msgspec.Meta(ge=1, le=MAX_HLC)]
DEVICE_PATTERN = "^[0-9a-f]{16}$"
"""A device's name in a folder: its node id, 16 hex digits."""
DeviceName = Annotated[str, msgspec.Meta(pattern=DEVICE_PATTERN)]


class FileBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a folder file says, signed: which device wrote it, its place among that
    device's files of its kind, the key generation that signed it, the envelopes, and
    (snapshots) how far into each device's segments the writer had merged."""

    format: int
    kind: Kind
    device: DeviceName
    number: Number
    generation: int
    envelopes: list[bytes]
    covers: dict[DeviceName, Annotated[int, msgspec.Meta(ge=0, le=MAX_HLC)]] = {}

    def __repr__(self) -> str:
        return f"FileBody({self.kind} {self.device}/{self.number}, {len(self.envelopes)} envelopes)"


class _SignedFile(msgspec.Struct, frozen=True, array_like=True):
    body: bytes
    signature: Signature


class _Generation(msgspec.Struct, frozen=True):
    """A body's generation alone, read before its signature is checked, to pick the key that
    must verify it (the rest of the body is skipped, not decoded)."""

    generation: int


@dataclass(frozen=True)
class FolderKeys:
    """What the folder's key bundles say (`FolderSession.take_bundles`)."""

    newer: bytes | None
    """The newest bundle that follows this device's generation, to take; None if none."""
    problems: list[str]


@dataclass(frozen=True)
class Sealed:
    """A segment to write: its bytes, and the batch to pass to `written` once durable."""

    data: bytes
    batch: PushBatch


class FolderSession:
    """One device's side of a folder; create it with `Replica.folder_session()`."""

    def __init__(self, core: Core, sync: SyncSession) -> None:
        self._core = core
        self._sync = sync
        self._retired: dict[int, bytes] = {}
        """Retired generations' signing keys, each vouched for by the next (`take_bundles`):
        a file they signed is checked genuine before it is set aside unread."""

    @property
    def device(self) -> str:
        """This device's name in the folder: its node id, in hex."""
        with self._core.mutex:
            return f"{self._core.node():016x}"

    def next_segment(self, number: int) -> Sealed | None:
        """The next batch of versions to write out, as segment `number`; None when none."""
        batch = self._sync.next_batch()
        if batch is None:
            return None
        return Sealed(self._seal("segment", number, batch.envelopes, {}), batch)

    def written(self, sealed: Sealed) -> None:
        """The segment is durable in the folder: its versions stop being dirty."""
        self._sync.acknowledge_written(sealed.batch)

    def restart(self) -> None:
        """Offer every dirty version again: each round begins so (within one pass, what was
        offered is never offered twice, and a rewritten record may reuse an offered row)."""
        self._sync.restart()

    def snapshot(self, number: int, covers: dict[str, int]) -> bytes:
        """Every version this replica holds (merged or held), as snapshot `number`, saying
        it covers `covers` (device → the files of it merged, in a row from the first).
        `ProtocolError` rather than a snapshot that would lose a reader something: one over
        `MAX_FILE_BYTES`, or one holding an envelope that does not open here (a reader that
        took it for the files it covers would never get the good copy)."""
        with self._core.mutex:
            keys = self._core.keys()
            held_bytes = self._core.store.version_envelope_bytes()
            if held_bytes > MAX_FILE_BYTES:  # refused before a byte of them is read
                raise ProtocolError(
                    f"{held_bytes:,} bytes of versions, above the bound of {MAX_FILE_BYTES:,}"
                )
            envelopes = self._core.store.all_version_envelopes()
        for envelope in envelopes:
            try:
                open_envelope(keys, envelope, parse_header(envelope))
            except UnknownEpochError:
                continue  # held for a key epoch this device has yet to take: as it came
            except (EnvelopeError, ProtocolError) as exc:
                raise ProtocolError(
                    f"this replica holds an envelope that does not open ({exc})",
                    hint="run `sealsync repair`",
                ) from None
        data = self._seal("snapshot", number, envelopes, covers)
        if len(data) > MAX_FILE_BYTES:
            raise ProtocolError(f"{len(data):,} bytes, above the bound of {MAX_FILE_BYTES:,}")
        return data

    def take_bundles(self, found: Mapping[int, bytes]) -> FolderKeys:
        """What the folder's key bundles (generation → bytes, `keys/bundle-G.bin`) say to
        this device: the newest generation that follows its own step by step, each bundle
        vouched for by the one before (`Replica.adopt_bundle` takes it, with the new
        passphrase), and what is wrong there (named; nothing else follows from it). A bundle
        that does not follow (garbage, a forgery, a rotation that raced another) never holds
        this device's writes back, and one of its own generation with another signing key
        does not stop it: it goes on under the keys it holds."""
        own, _ = self._bundle_and_generation()
        problems = []
        theirs = _parsed(found.get(own.generation))
        if theirs is not None and theirs.signing_public != own.signing_public:
            problems.append(
                f"{_keys_file(own.generation)} is not this device's generation "
                f"{own.generation}: two devices changed the keys at once, or a revoked "
                "device wrote it; this device goes on under its own (if none of yours "
                "changed the keys, remove the revoked device from the file-sync tool)"
            )
        self._retired = _retired_keys(own, found)
        newest, before = None, own
        for generation in range(own.generation + 1, max(found, default=0) + 1):
            following = _parsed(found.get(generation))
            if following is None or following.generation != generation:
                break
            if not verify_chain(following, before.signing_public):
                problems.append(
                    f"{_keys_file(generation)} is not vouched for by generation "
                    f"{generation - 1}: not taken"
                )
                break
            newest, before = found[generation], following
        if newest is None and max(found, default=0) > own.generation and not problems:
            problems.append(f"{_keys_file(max(found))} does not follow this device's keys")
        return FolderKeys(newest, problems)

    def open(self, data: bytes, device: str, number: int, kind: Kind) -> FileBody:
        """What the file found at `device`'s place `number` of `kind` says, if it is whole,
        signed under this account's current key generation, and names that place;
        `ProtocolError` naming why not (nothing of a refused file is read)."""
        if len(data) > MAX_FILE_BYTES:
            raise ProtocolError(f"{len(data)} bytes, above the bound of {MAX_FILE_BYTES}")
        try:
            signed = msgspec.msgpack.decode(data, type=_SignedFile)
            claimed = msgspec.msgpack.decode(signed.body, type=_Generation).generation
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"not a folder file (cut short, or another kind): {exc}") from None
        signing_public, retired = self._signing_public(claimed)
        try:
            Ed25519PublicKey.from_public_bytes(signing_public).verify(
                signed.signature, SIGNED_LABEL + signed.body
            )
        except InvalidSignature:
            raise ProtocolError(
                "its signature does not verify: not written by this account's devices "
                "(forged, damaged, or signed under other keys)"
            ) from None
        try:
            body = msgspec.msgpack.decode(signed.body, type=FileBody)
        except msgspec.DecodeError as exc:  # signed, so written by a device of another version
            raise ProtocolError(f"a folder file this device cannot read: {exc}") from None
        if body.format != FOLDER_FORMAT:
            raise ProtocolError(f"format {body.format}: this device reads {FOLDER_FORMAT}")
        if (body.kind, body.device, body.number) != (kind, device, number):
            raise ProtocolError(
                f"it says it is {body.kind} {body.device}/{body.number}, not {kind} "
                f"{device}/{number}: moved from its place"
            )
        if retired:  # genuine, in its place, and never to be read
            raise RetiredKeysError(f"signed under key generation {claimed}, retired")
        return body

    def _signing_public(self, generation: int) -> tuple[bytes, bool]:
        """The key that must verify a file claiming `generation` (the claim is signed too),
        and whether that generation is retired. A file of a retired generation is verified,
        then never read: a revoked device still signs with that key, and whatever it wrote
        could only be checked by a version vector it can make up; each device that takes a
        rotation writes what it holds again under the new keys (the rotating device
        everything)."""
        bundle, current = self._bundle_and_generation()
        if generation > current:
            raise NewerKeysError(
                f"signed under key generation {generation}, newer than this device's "
                f"{current}: `sealsync sync` takes the new keys (with the new passphrase)"
            )
        if generation == current:
            return bundle.signing_public, False
        retired = self._retired.get(generation)
        if retired is None:
            raise ProtocolError(
                f"signed under key generation {generation}, which no bundle in the folder's "
                "keys/ vouches for (missing, or not signed by the next generation)"
            )
        return retired, True

    def merge(self, body: FileBody) -> Merged:
        """Merge an opened file's envelopes as if pulled."""
        with self._core.mutex:
            self._core.check_open()
        return merge_outside(self._core, body.envelopes, f"folder:{body.device}")

    def _seal(
        self, kind: Kind, number: int, envelopes: list[bytes], covers: dict[str, int]
    ) -> bytes:
        with self._core.mutex:
            keys = self._core.keys()
            self._core.refuse_stale_keys()
            signing_key = keys.signing_key
            generation = keys.generation
        if signing_key is None:
            raise _unsigned()
        body = FileBody(FOLDER_FORMAT, kind, self.device, number, generation, envelopes, covers)
        body_bytes = msgspec.msgpack.encode(body)
        signature = Ed25519PrivateKey.from_private_bytes(signing_key).sign(
            SIGNED_LABEL + body_bytes
        )
        return msgspec.msgpack.encode(_SignedFile(body_bytes, signature))

    def _bundle_and_generation(self) -> tuple[KeyBundleV2, int]:
        with self._core.mutex:
            keys = self._core.keys()
            bundle = self._core.bundle()
        if not isinstance(bundle, KeyBundleV2):
            raise _unsigned()
        return bundle, keys.generation


def _retired_keys(own: KeyBundleV2, found: Mapping[int, bytes]) -> dict[int, bytes]:
    """The signing keys of the generations before `own`, down the chain of `found` bundles,
    each vouched for by the next; a gap or a forgery ends it."""
    keys, later = {}, own
    for generation in range(own.generation - 1, 0, -1):
        earlier = _parsed(found.get(generation))
        if earlier is None or earlier.generation != generation:
            break
        if not verify_chain(later, earlier.signing_public):
            break
        keys[generation], later = earlier.signing_public, earlier
    return keys


def bundle_name(generation: int) -> str:
    """The name of generation `generation`'s key bundle in a folder's `keys/`."""
    return f"bundle-{generation:06d}.bin"


def _keys_file(generation: int) -> str:
    return f"keys/{bundle_name(generation)}"


def _parsed(data: bytes | None) -> KeyBundleV2 | None:
    """A version-2 bundle, or None for none or one that does not parse (no chain through it)."""
    if data is None:
        return None
    try:
        bundle = parse_bundle(data)
    except (ProtocolError, InvalidArgumentError):
        return None
    return bundle if isinstance(bundle, KeyBundleV2) else None


def _unsigned() -> InvalidArgumentError:
    return InvalidArgumentError(
        "a version-1 account signs nothing, and a folder needs signed files",
        hint="upgrade the account's keys first (`sealsync upgrade`)",
    )
