"""Argon2id parameters of an account's passphrase: in clear for prelogin, and checked on every
side (replica/wire.py re-exports them: the relay reads them as part of the wire format)."""

from __future__ import annotations

import msgspec

from replica.errors import KdfParametersError

MIN_MEMORY_KIB = 64 * 1024
MAX_MEMORY_KIB = 1024 * 1024
MIN_ITERATIONS = 3
MAX_ITERATIONS = 10
MAX_LANES = 16
SALT_BYTES = 16


class KdfParams(msgspec.Struct, frozen=True):
    """Argon2id parameters and salt of an account's passphrase."""

    salt: bytes
    memory_kib: int = MIN_MEMORY_KIB
    iterations: int = MIN_ITERATIONS
    lanes: int = 1

    def __repr__(self) -> str:
        return f"KdfParams(m={self.memory_kib} KiB, t={self.iterations}, p={self.lanes})"


def check_kdf_params(params: KdfParams) -> None:
    """Refuse parameters outside the floors and ceilings (a weak or a hostile cost)."""
    bounds = (
        ("memory_kib", params.memory_kib, MIN_MEMORY_KIB, MAX_MEMORY_KIB),
        ("iterations", params.iterations, MIN_ITERATIONS, MAX_ITERATIONS),
        ("lanes", params.lanes, 1, MAX_LANES),
        ("salt length", len(params.salt), SALT_BYTES, SALT_BYTES),
    )
    for name, value, low, high in bounds:
        if not low <= value <= high:
            raise KdfParametersError(
                f"Argon2id {name} {value} outside {low}..{high}",
                hint="parameters outside the bounds are refused whether stored or served",
            )
