"""`sealsync upgrade` on an account made before key bundle version 2, through a real relay
process: the account moves to signed pushes, its other device takes the new keys at its next
sync, and nothing written before or during the move is lost (docs/key-generations.md §5)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from clients.cli import main
from clients.errors import RelayRefusedError
from clients.http import RelayClient
from replica import recovery_login_keys
from replica.wire import ErrorCode, LoginRequest, PushBatch, RegisterRequest, auth_key_hash
from tests.clients.test_cli import Cli, assert_user_error, dump
from tests.relay.conftest import HLC, envelope
from tests.relay.server import RelayProcess
from tests.replica.v1 import V1Account


def register_v1(url: str, v1: V1Account) -> None:
    """The account as a relay holds one registered before version 2."""
    recovery_hash = auth_key_hash(recovery_login_keys(v1.recovery_key).auth_key)
    request = RegisterRequest(
        "old", v1.login.auth_key, recovery_hash, v1.bundle.kdf, v1.bundle_bytes, "setup"
    )
    with RelayClient(url) as client:
        client.register(request)


def run(cli: Cli, v1: V1Account, replica: Path, *args: str, recovery_key: str = "") -> Result:
    env = {"SEALSYNC_PASSPHRASE": v1.passphrase, "SEALSYNC_RECOVERY_KEY": recovery_key,
           "XDG_CONFIG_HOME": str(cli.home / "config")}  # fmt: skip
    result = cli.runner.invoke(main, ["--replica", str(replica), *args], env=env)
    return result


def ok(result: Result) -> Result:
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.slow
def test_a_version_1_account_upgrades_and_its_other_device_takes_the_new_keys(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path, v1: V1Account
) -> None:
    relay = start_relay()
    register_v1(relay.url, v1)
    a, b, c = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "c.db"
    for path, name in ((a, "desk"), (b, "laptop"), (c, "phone")):
        ok(
            run(
                cli,
                v1,
                path,
                "join",
                "--relay",
                relay.url,
                "--account",
                "old",
                "--device-name",
                name,
            )
        )
    ok(run(cli, v1, a, "put", "threads", "before", '{"title": "written under version 1"}'))
    assert "version 1" in ok(run(cli, v1, a, "sync")).stderr
    ok(run(cli, v1, b, "put", "threads", "pending", '{"title": "not yet pushed"}'))

    before = dump(a)
    wrong = run(cli, v1, a, "upgrade", recovery_key="AAAA-" * 13 + "AAAA")
    assert_user_error(wrong, "recovery key")
    assert dump(a) == before
    assert "version 2" in ok(run(cli, v1, a, "upgrade", recovery_key=v1.recovery_key)).stdout
    ok(run(cli, v1, a, "put", "threads", "after", '{"title": "written under version 2"}'))
    assert "version 1" not in ok(run(cli, v1, a, "sync")).stderr

    for device in (b, c):  # b has a write to push (refused unsigned); c only pulls (held)
        synced = ok(run(cli, v1, device, "sync"))
        assert "took the account's newer keys" in synced.stdout, synced.output
        assert "version 1" not in synced.stderr
    ok(run(cli, v1, a, "sync"))
    ok(run(cli, v1, c, "sync"))
    for path in (a, b, c):
        for record in ("before", "pending", "after"):
            assert ok(run(cli, v1, path, "get", "threads", record)).stdout
    assert "already version 2" in ok(run(cli, v1, b, "upgrade")).stdout

    with RelayClient(relay.url) as client:  # a stolen token alone pushes nothing now
        client.login(LoginRequest("old", v1.login.auth_key, "thief"))
        with pytest.raises(RelayRefusedError) as refused:
            client.push(PushBatch([envelope(os.urandom(16), 7, HLC, {7: HLC})]))
        assert refused.value.code == ErrorCode.FORBIDDEN
