"""Operator settings of a relay: limits, token lifetimes, signup, trusted proxies.

Settings come from, lowest first: the defaults here, a TOML file, `SEALSYNC_RELAY_*`
environment variables, command-line flags (`load_config`). Every field is checked; a bad value
is an `InvalidArgumentError` naming the setting and its bound.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from relay.collection import DAY_MS
from relay.storage import (
    DEFAULT_MAX_ACCOUNT_BYTES,
    DEFAULT_MAX_DRIFT_MS,
    DEFAULT_MAX_PAGE_BYTES,
    DEFAULT_MAX_PUSH_ENVELOPES,
    DEFAULT_PAGE_SIZE,
    VersionRules,
)
from replica.errors import InvalidArgumentError
from replica.wire import MAX_ANSWER_BYTES, MAX_ENVELOPE_BYTES, PAGE_FRAMING_BYTES, RelayLimits

ENV_PREFIX = "SEALSYNC_RELAY_"


@dataclass(frozen=True)
class RelayConfig:
    """Every operator setting of the relay, with the defaults of specs/limits.md §relay."""

    max_body_bytes: int = 16 * 1024 * 1024
    max_envelope_bytes: int = MAX_ENVELOPE_BYTES
    max_push_envelopes: int = DEFAULT_MAX_PUSH_ENVELOPES
    page_size: int = DEFAULT_PAGE_SIZE
    max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES
    max_account_bytes: int = DEFAULT_MAX_ACCOUNT_BYTES
    max_drift_ms: int = DEFAULT_MAX_DRIFT_MS
    requests_per_second: float = 50.0
    """Per token, and per client address behind a trusted proxy (token bucket)."""
    burst: int = 200
    max_login_failures: int = 10
    """Failed logins per account name from one client address within `login_window_s`
    before that address's logins for it wait (other addresses are not affected)."""
    account_login_failures: int = 100
    """Failed logins per account name from every address within `login_window_s` beyond
    which each login for it is slowed by `slow_login_ms`: slowed, never refused, so no one
    can lock a person out of their account by failing on purpose."""
    slow_login_ms: int = 2000
    login_window_s: int = 15 * 60
    access_token_s: int = 60 * 60
    refresh_token_s: int = 180 * 24 * 60 * 60
    """A refresh token lasts this long after its last use, so a long-offline device keeps
    working; each refresh replaces it."""
    refresh_grace_s: int = 5 * 60
    """A used refresh token works again this long, for a device whose reply was lost; its
    unreceived successors are replaced (refused once the device used them)."""
    invite_s: int = 7 * 24 * 60 * 60
    open_signup: bool = False
    trusted_proxies: tuple[str, ...] = ()
    """Addresses whose X-Forwarded-For is believed; per-IP limits apply only behind them."""
    heartbeat_s: float = 15.0
    metrics: bool = False
    """Serve the relay's metrics at GET /metrics (Prometheus' text format, no token asked:
    counts by route and status only; expose the port only where the scraper is)."""
    collect: bool = False
    """Run tombstone collection over every account every `collect_every_s`, leaving out
    devices silent for `tombstone_horizon_days` (they resync when they return): deleted
    data then gives its space back without `sealsync relay collect` (specs/protocol.md §5.1)."""
    collect_every_s: int = 60 * 60
    tombstone_horizon_days: int = 90
    """Below `refresh_token_s`: a device that still holds a live session has acked within."""
    accept_unsigned_pushes: bool = False
    """Take unsigned pushes into version-1 accounts, which have no signing key: for a
    transition only, for a stolen token can then forge their versions. Off, their devices
    are told to run `sealsync upgrade` (specs/protocol.md §4.7)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", "float") and (
                isinstance(value, bool) or not 0 < value < math.inf  # NaN fails this too
            ):
                raise InvalidArgumentError(
                    f"relay setting {f.name} = {value!r} must be a finite number > 0"
                )
        if self.max_envelope_bytes > MAX_ENVELOPE_BYTES:  # larger ones are refused as malformed
            raise InvalidArgumentError(
                f"max_envelope_bytes {self.max_envelope_bytes} must be at most "
                f"{MAX_ENVELOPE_BYTES}, the largest envelope the wire format allows"
            )
        if self.max_page_bytes > MAX_ANSWER_BYTES - PAGE_FRAMING_BYTES:  # devices read no more
            raise InvalidArgumentError(
                f"max_page_bytes {self.max_page_bytes} must be at most "
                f"{MAX_ANSWER_BYTES - PAGE_FRAMING_BYTES}: devices read no answer over "
                f"{MAX_ANSWER_BYTES} bytes"
            )
        if self.max_envelope_bytes > self.max_body_bytes - 1024:
            raise InvalidArgumentError(
                f"max_envelope_bytes {self.max_envelope_bytes} must leave room in "
                f"max_body_bytes {self.max_body_bytes} (1 KiB for framing)"
            )

    def version_rules(self, clock_ms: Callable[[], int]) -> VersionRules:
        """The bounds storage applies itself (inside its transactions)."""
        return VersionRules(
            clock_ms,
            self.max_drift_ms,
            self.page_size,
            self.max_account_bytes,
            self.max_page_bytes,
            self.accept_unsigned_pushes,
        )

    def limits(self) -> RelayLimits:
        """What `GET /v1/info` tells clients."""
        return RelayLimits(
            max_body_bytes=self.max_body_bytes,
            max_envelope_bytes=self.max_envelope_bytes,
            max_push_envelopes=self.max_push_envelopes,
            page_size=self.page_size,
            max_page_bytes=self.max_page_bytes,
            max_account_bytes=self.max_account_bytes,
            max_drift_ms=self.max_drift_ms,
            requests_per_second=self.requests_per_second,
            burst=self.burst,
            tombstone_horizon_ms=self.tombstone_horizon_days * DAY_MS,
        )


_FIELDS = {f.name: f for f in dataclasses.fields(RelayConfig)}


def _coerce(name: str, value: object) -> object:
    kind = _FIELDS[name].type
    try:
        if kind == "bool":
            if isinstance(value, str):
                if value.lower() not in {"1", "0", "true", "false", "yes", "no"}:
                    raise ValueError(value)
                return value.lower() in {"1", "true", "yes"}
            return bool(value)
        if kind == "int":
            if isinstance(value, (bool, float)):
                raise ValueError(value)
            return int(value)  # type: ignore[call-overload]
        if kind == "float":
            return float(value)  # type: ignore[arg-type]
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return tuple(str(v) for v in value)  # type: ignore[attr-defined]
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"relay setting {name} = {value!r} is not a {kind}") from exc


def load_config(
    toml_path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, object] | None = None,
) -> RelayConfig:
    """Defaults < TOML file (a `[relay]` table or top-level keys) < environment < flags."""
    values: dict[str, object] = {}
    if toml_path is not None:
        try:
            document = tomllib.loads(toml_path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidArgumentError(f"cannot read relay config {toml_path}: {exc}") from exc
        table = document.get("relay", document)
        if not isinstance(table, dict):
            raise InvalidArgumentError(f"relay config {toml_path}: [relay] must be a table")
        values.update(table)
    for key, value in (environ or {}).items():
        if key.startswith(ENV_PREFIX) and key[len(ENV_PREFIX) :].lower() in _FIELDS:
            values[key[len(ENV_PREFIX) :].lower()] = value
    values.update({k: v for k, v in (flags or {}).items() if v is not None})
    unknown = sorted(set(values) - set(_FIELDS))  # from the file or a flag; unknown
    if unknown:  # SEALSYNC_RELAY_* variables are ignored, as other programs' would be
        raise InvalidArgumentError(
            f"unknown relay settings {unknown}", hint=f"known: {', '.join(sorted(_FIELDS))}"
        )
    return RelayConfig(**{name: _coerce(name, value) for name, value in values.items()})  # type: ignore[arg-type]
