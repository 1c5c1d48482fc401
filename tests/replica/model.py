"""A reference model of the merge semantics, written from docs/architecture.md §4 without `replica.merge`.

It keeps every version ever written. A version's vector is computed here from the versions it
replaced (not read back from the replica), dominance is read off the vectors, and the visible
sibling is the greatest by (hlc, tiebreak, live, node).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelVersion:
    record: tuple[str, str, str]
    node: int
    hlc: int
    vector: tuple[tuple[int, int], ...]
    deleted: bool
    document: Any

    @property
    def dot(self) -> tuple[int, int]:
        return (self.node, self.hlc)

    def covers(self, other: ModelVersion) -> bool:
        return dict(self.vector).get(other.node, 0) >= other.hlc


@dataclass
class Model:
    tiebreak_by_collection: dict[str, str]
    versions: dict[tuple[int, int], ModelVersion] = field(default_factory=dict)

    def write(
        self,
        record: tuple[str, str, str],
        node: int,
        hlc: int,
        replaced: list[tuple[int, int]],
        deleted: bool,
        document: Any,
    ) -> None:
        vector: dict[int, int] = {}
        for dot in replaced:
            for n, h in self.versions[dot].vector:
                vector[n] = max(vector.get(n, 0), h)
        vector[node] = hlc
        self.versions[(node, hlc)] = ModelVersion(
            record, node, hlc, tuple(sorted(vector.items())), deleted, None if deleted else document
        )

    def siblings(self, record: tuple[str, str, str]) -> list[ModelVersion]:
        mine = [v for v in self.versions.values() if v.record == record]
        return [v for v in mine if not any(o is not v and o.covers(v) for o in mine)]

    def visible(self, record: tuple[str, str, str]) -> ModelVersion:
        field_name = self.tiebreak_by_collection.get(record[1])

        def key(v: ModelVersion) -> tuple[Any, ...]:
            value = (
                v.document.get(field_name) if field_name and isinstance(v.document, dict) else None
            )
            tiebreak = (
                (1, value) if isinstance(value, int) and not isinstance(value, bool) else (0, 0)
            )
            return (v.hlc, tiebreak, 0 if v.deleted else 1, v.node)

        return max(self.siblings(record), key=key)

    def records(self) -> set[tuple[str, str, str]]:
        return {v.record for v in self.versions.values()}
