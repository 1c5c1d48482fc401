"""Who may come in, and how often: a request's caller, its address, and the limits on both.

Authenticated requests are the account their access token names (`Gate.caller`: one answer
for every way a token can be wrong), limited per token, and per address behind a trusted
proxy only. Prelogin, register, login and refresh, which anyone can reach, are limited per
address always. Failed logins are counted per (account name, address) in the storage, so
one address failing on purpose never locks out another, no relay process forgets them, and
no flood of names evicts them (specs/limits.md).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio.to_thread
from starlette.requests import Request

from relay import tokens
from relay.config import RelayConfig
from relay.errors import (
    DeviceRevokedError,
    RateLimitedError,
    StoreFailedError,
    UnauthorizedError,
    is_storage_error,
)
from relay.storage import LoginFailures, Storage
from relay.throttle import TokenBuckets

log = logging.getLogger(f"sealsync.{__name__}")
T = TypeVar("T")


@dataclass(frozen=True)
class Caller:
    """Who sent a request, from its access token."""

    account: str
    device_id: str
    token_hash: bytes = field(repr=False)
    expires_ms: int


MAX_WARNED_PEERS = 1000
"""Peers warned about an ignored X-Forwarded-For, remembered so the log names each once."""
MAX_ADDRESS_CHARS = 64


def _printable(address: str) -> str:
    """An address as counted and logged: printable characters only, bounded."""
    return "".join(c for c in address if c.isprintable())[:MAX_ADDRESS_CHARS]


async def in_worker_thread(function: Callable[..., T], *args: Any) -> T:
    """Run a storage call in a worker thread (storage is synchronous); its database's
    failure, whatever the backend raised, as `StoreFailedError`."""
    try:
        return await anyio.to_thread.run_sync(function, *args)
    except Exception as exc:
        if not is_storage_error(exc) or isinstance(exc, StoreFailedError):
            raise
        raise StoreFailedError(f"the relay's storage failed: {exc}") from exc


def _peer(request: Request) -> str:
    return request.client.host if request.client else ""


def _rate(config: RelayConfig) -> str:
    """The request limit in words, for a refusal."""
    return f"{config.requests_per_second:g} requests a second (bursts of {config.burst})"


class Gate:
    """The caller checks and rate limits of one relay process."""

    def __init__(self, storage: Storage, config: RelayConfig, clock_ms: Callable[[], int]):
        self.storage = storage
        self.config = config
        self.clock_ms = clock_ms
        self.token_buckets = TokenBuckets(config.requests_per_second, config.burst, clock_ms)
        self.address_buckets = TokenBuckets(config.requests_per_second, config.burst, clock_ms)
        self._warned_peers: set[str] = set()

    call = staticmethod(in_worker_thread)

    def client_address(self, request: Request) -> str:
        """The client's address: the peer's, or behind a trusted proxy the last address its
        `X-Forwarded-For` names that is not a trusted proxy (the left-hand ones are the
        client's to forge). A header from an untrusted peer is ignored, with a warning."""
        peer = _peer(request)
        forwarded = [
            part.strip()
            for part in request.headers.get("x-forwarded-for", "").split(",")
            if part.strip()
        ]
        if peer not in self.config.trusted_proxies:
            if forwarded:
                self._warn_untrusted_forwarding(peer)
            return _printable(peer)
        untrusted = [a for a in forwarded if a not in self.config.trusted_proxies]
        return _printable(untrusted[-1] if untrusted else peer)

    def _warn_untrusted_forwarding(self, peer: str) -> None:
        if peer in self._warned_peers:
            return
        if len(self._warned_peers) >= MAX_WARNED_PEERS:
            self._warned_peers.clear()
        self._warned_peers.add(peer)
        log.warning(
            "X-Forwarded-For from a peer that is not a trusted proxy is ignored; per-address "
            "limits count the peer (set trusted_proxies if a proxy is in front)",
            extra={"peer": _printable(peer)},
        )

    def limit_address(self, request: Request) -> None:
        """Authenticated requests are limited per token; per address too only behind a
        trusted proxy: elsewhere every client of a NAT would share one address and bucket."""
        if _peer(request) in self.config.trusted_proxies:
            self._take_for_address(self.client_address(request))

    def limit_unauthenticated(self, request: Request) -> str:
        """Prelogin, register, login and refresh are what a flood without any token can
        reach: they are limited per address always (the peer's without a trusted proxy).
        Returns the address."""
        address = self.client_address(request)
        self._take_for_address(address)
        return address

    def _take_for_address(self, address: str) -> None:
        wait = self.address_buckets.take(address)
        if wait is not None:
            raise RateLimitedError(
                f"over {_rate(self.config)} from this address",
                retry_after_s=wait,
            )

    async def caller(self, request: Request) -> Caller:
        """The account and device of the request's access token; one answer for every way a
        token can be wrong, so none of them can be told apart, but for a revoked device's."""
        self.limit_address(request)
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        digest = tokens.token_hash(token.strip()) if scheme.lower() == "bearer" else None
        record = await self.call(self.storage.token, digest) if digest else None
        if record is None and digest:
            await self.refuse_revoked(digest)
        if record is None or record.kind != "access" or record.expires_ms <= self.clock_ms():
            raise UnauthorizedError()
        wait = self.token_buckets.take(record.device_id + "/" + record.account)
        if wait is not None:
            raise RateLimitedError(
                f"over {_rate(self.config)} with this token",
                retry_after_s=wait,
            )
        return Caller(record.account, record.device_id, record.hash, record.expires_ms)

    async def refuse_revoked(self, token_hash: bytes) -> None:
        """Raise `DeviceRevokedError` for a token whose device was revoked: the holder of that
        token is that device, and should stop rather than log in again."""
        if await self.call(self.storage.is_revoked_token, token_hash):
            raise DeviceRevokedError()

    async def throttle_login(self, name: str, address: str) -> LoginFailures:
        """Failed logins are counted per (account name, address), names that exist or not
        alike: past `max_login_failures` that address waits out the window, while a correct
        key from any other address still gets in. Past `account_login_failures` from every
        address, each login for the name is slowed, never refused. Returns the counts."""
        config = self.config
        now = self.clock_ms()
        window_ms = config.login_window_s * 1000
        failures = await self.call(self.storage.login_failures, name, address, now - window_ms)
        if failures.from_address >= config.max_login_failures:
            oldest = failures.oldest_from_address_ms
            assert oldest is not None, "counted failures have a time"
            raise RateLimitedError(
                f"{failures.from_address} failed logins for this name from this address within "
                f"{config.login_window_s} s (at most {config.max_login_failures})",
                retry_after_s=max(1, math.ceil((oldest + window_ms - now) / 1000)),
            )
        if failures.from_anywhere >= config.account_login_failures:
            await asyncio.sleep(config.slow_login_ms / 1000)
        return failures

    async def login_failed(self, name: str, address: str) -> None:
        now = self.clock_ms()
        forget_before_ms = now - self.config.login_window_s * 1000
        await self.call(self.storage.add_login_failure, name, address, now, forget_before_ms)
