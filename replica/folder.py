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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from replica.envelope import open_envelope
from replica.errors import EnvelopeError, InvalidArgumentError, ProtocolError, UnknownEpochError
from replica.generations import KeyBundleV2
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

    def open(self, data: bytes, device: str, number: int, kind: Kind) -> FileBody:
        """What the file found at `device`'s place `number` of `kind` says, if it is whole,
        signed by this account's current key generation, and names that place;
        `ProtocolError` naming why not (nothing of a refused file is read)."""
        bundle, keys = self._bundle_and_generation()
        if len(data) > MAX_FILE_BYTES:
            raise ProtocolError(f"{len(data)} bytes, above the bound of {MAX_FILE_BYTES}")
        try:
            signed = msgspec.msgpack.decode(data, type=_SignedFile)
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"not a folder file (cut short, or another kind): {exc}") from None
        try:
            Ed25519PublicKey.from_public_bytes(bundle.signing_public).verify(
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
        if (body.format, body.generation) != (FOLDER_FORMAT, keys):
            raise ProtocolError(
                f"format {body.format}, key generation {body.generation}: this device reads "
                f"format {FOLDER_FORMAT} under generation {keys}"
            )
        if (body.kind, body.device, body.number) != (kind, device, number):
            raise ProtocolError(
                f"it says it is {body.kind} {body.device}/{body.number}, not {kind} "
                f"{device}/{number}: moved from its place"
            )
        return body

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


def _unsigned() -> InvalidArgumentError:
    return InvalidArgumentError(
        "a version-1 account signs nothing, and a folder needs signed files",
        hint="upgrade the account's keys first (`sealsync upgrade`)",
    )
