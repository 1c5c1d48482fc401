"""An app's collections and the merge policy of each: made only of serializable parts.

The schema is stored in the replica and, sealed, in the key bundle, so a joining device and
the command line know it. A tiebreak is a field name, never a function (specs/merge.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

import msgspec

from replica.errors import InvalidArgumentError, ProtocolError
from replica.limits import check_name

Policy = Literal["lww", "per_item", "register", "local"]
POLICIES: tuple[str, ...] = get_args(Policy)
REGISTER_ID = "value"
"""The one record id of a register collection (one value per profile)."""
PROFILES_COLLECTION = "sealsync.profiles"
"""Internal lww collection, in the default profile, that lists the account's profiles."""
JOURNAL_COLLECTION = "sealsync.journal"
"""The collection journal entries are sealed under (replica/journal.py): no record's."""
DEFAULT_PROFILE = "default"
MAX_HISTORY = 10_000


class Collection(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One named set of records and how concurrent versions of them are shown and bounded.

    `tiebreak` names an integer document field that breaks equal-hlc ties (threads:
    `message_count`); `max_items` bounds a per_item set on local writes only; `history` keeps
    that many replaced versions per record on this device. `index` names a top-level document
    field (string or integer values) that `scan(where=)` finds records by without opening the
    others, in the order of the integer field `created_field` (else of each version's hlc):
    a blind index kept on this device only (replica/blind.py). `unique_ids` says each record
    id is drawn at random by the device that creates the record (a ULID, a UUID): no other
    device can hold a version of a record this one is creating, so that write takes no
    freshness lock (specs/merge.md §10).
    """

    name: str
    policy: Policy = "lww"
    tiebreak: str | None = None
    max_items: int | None = None
    history: int = 0
    index: str | None = None
    created_field: str | None = None
    unique_ids: bool = False

    def __post_init__(self) -> None:
        check_name("collection name", self.name)
        if self.policy not in POLICIES:
            raise InvalidArgumentError(f"collection {self.name!r}: unknown policy {self.policy!r}")
        if self.max_items is not None and (self.policy != "per_item" or self.max_items < 1):
            raise InvalidArgumentError(
                f"collection {self.name!r}: max_items needs policy per_item and a value ≥ 1"
            )
        if self.tiebreak is not None:
            check_name("tiebreak field", self.tiebreak)
        self._check_index()
        if self.unique_ids and self.policy not in ("lww", "per_item"):
            raise InvalidArgumentError(
                f"collection {self.name!r}: unique_ids needs policy lww or per_item, "
                f"not {self.policy!r}"
            )
        if not 0 <= self.history <= MAX_HISTORY:
            raise InvalidArgumentError(
                f"collection {self.name!r}: history {self.history} outside 0..{MAX_HISTORY}"
            )

    def _check_index(self) -> None:
        if self.index is not None:
            check_name("index field", self.index)
            if self.policy not in ("lww", "per_item"):
                raise InvalidArgumentError(
                    f"collection {self.name!r}: an index needs policy lww or per_item, "
                    f"not {self.policy!r}"
                )
        if self.created_field is not None:
            check_name("created_field", self.created_field)
            if self.index is None:
                raise InvalidArgumentError(
                    f"collection {self.name!r}: created_field orders indexed reads: "
                    "declare an index too"
                )

    @property
    def is_synced(self) -> bool:
        return self.policy != "local"


@dataclass(frozen=True)
class Schema:
    """The collections of an app, by name."""

    collections: tuple[Collection, ...]
    _by_name: dict[str, Collection] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [c.name for c in self.collections]
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"schema declares a collection twice: {sorted(names)}")
        for reserved in (PROFILES_COLLECTION, JOURNAL_COLLECTION):
            if reserved in names:
                raise InvalidArgumentError(f"{reserved!r} is reserved for sealsync")
        object.__setattr__(self, "_by_name", {c.name: c for c in self.collections})

    def get(self, name: str) -> Collection | None:
        if name == PROFILES_COLLECTION:
            return _PROFILES
        return self._by_name.get(name)

    def require(self, name: str) -> Collection:
        """The declared collection `name`, or a clear error for an undeclared one."""
        collection = self.get(name)
        if collection is None:
            declared = ", ".join(c.name for c in self.collections) or "none"
            raise InvalidArgumentError(
                f"collection {name!r} is not declared in the schema (declared: {declared})",
                hint="declare it with Replica.declare(schema)",
            )
        return collection


_PROFILES = Collection(PROFILES_COLLECTION, "lww")


def schema_to_bytes(schema: Schema) -> bytes:
    return msgspec.msgpack.encode(list(schema.collections))


def schema_from_bytes(data: bytes) -> Schema:
    try:
        return Schema(tuple(msgspec.msgpack.decode(data, type=list[Collection])))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"malformed schema: {exc}") from exc
