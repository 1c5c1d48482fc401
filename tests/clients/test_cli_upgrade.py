"""`sealsync upgrade` on an account made before key bundle version 2, through a real relay
process: the account moves to signed pushes, its other device takes the new keys at its next
sync, and nothing written before or during the move is lost (docs/key-generations.md §5)."""

from __future__ import annotations

import json
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


def run(
    cli: Cli, v1: V1Account, replica: Path, *args: str, recovery_key: str = "", **env: str
) -> Result:
    env = {"SEALSYNC_PASSPHRASE": v1.passphrase, "SEALSYNC_RECOVERY_KEY": recovery_key,
           "XDG_CONFIG_HOME": str(cli.home / "config"), **env}  # fmt: skip
    return cli.runner.invoke(main, ["--replica", str(replica), *args], env=env)


def joined_v1(
    cli: Cli, v1: V1Account, relay: RelayProcess, tmp_path: Path, *names: str
) -> list[Path]:
    """Replicas of the version-1 account, one per device name, joined through the CLI."""
    register_v1(relay.url, v1)
    paths = [tmp_path / f"{name}.db" for name in names]
    for path, name in zip(paths, names, strict=True):
        join = ("join", "--relay", relay.url, "--account", "old", "--device-name", name)
        ok(run(cli, v1, path, *join))
    return paths


def ok(result: Result) -> Result:
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.slow
def test_a_version_1_account_upgrades_and_its_other_device_takes_the_new_keys(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path, v1: V1Account
) -> None:
    relay = start_relay()
    a, b, c = joined_v1(cli, v1, relay, tmp_path, "desk", "laptop", "phone")
    ok(run(cli, v1, a, "put", "threads", "before", '{"title": "written under version 1"}'))
    assert_user_error(run(cli, v1, a, "sync"), "only signed pushes", "sealsync upgrade")
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

    with RelayClient(relay.url) as client:  # a device token without the key pushes nothing
        client.login(LoginRequest("old", v1.login.auth_key, "thief"))
        with pytest.raises(RelayRefusedError) as refused:
            client.push(PushBatch([envelope(os.urandom(16), 7, HLC, {7: HLC})]))
        assert refused.value.code == ErrorCode.FORBIDDEN


@pytest.mark.slow
def test_a_device_that_missed_a_passphrase_change_takes_the_upgraded_keys_with_the_new_one(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path, v1: V1Account
) -> None:
    """b's replica still opens with the old passphrase, but the relay's upgraded bundle only
    with the new one: b is asked for it (SEALSYNC_NEW_PASSPHRASE) and takes the keys."""
    relay = start_relay()
    a, b = joined_v1(cli, v1, relay, tmp_path, "desk", "laptop")
    new = "a changed and much longer passphrase for the account"
    ok(run(cli, v1, a, "passwd", SEALSYNC_NEW_PASSPHRASE=new))
    ok(run(cli, v1, a, "upgrade", recovery_key=v1.recovery_key, SEALSYNC_PASSPHRASE=new))
    ok(run(cli, v1, b, "put", "threads", "pending", '{"title": "from b"}'))
    synced = ok(run(cli, v1, b, "sync", SEALSYNC_NEW_PASSPHRASE=new))
    assert "took the account's newer keys" in synced.stdout, synced.output
    ok(run(cli, v1, a, "sync", SEALSYNC_PASSPHRASE=new))
    assert ok(run(cli, v1, a, "get", "threads", "pending", SEALSYNC_PASSPHRASE=new)).stdout
    assert ok(run(cli, v1, b, "get", "threads", "pending", SEALSYNC_PASSPHRASE=new)).stdout


@pytest.mark.slow
def test_a_version_1_account_revokes_without_rotating_and_says_so(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path, v1: V1Account
) -> None:
    relay = start_relay()
    desk, laptop = joined_v1(cli, v1, relay, tmp_path, "desk", "laptop")
    listed = ok(run(cli, v1, desk, "devices", "--json")).stdout
    laptop_id = next(d["id"] for d in json.loads(listed) if d["name"] == "laptop")
    refused = run(cli, v1, desk, "devices", "--revoke", laptop_id, "--new-recovery-key")
    assert_user_error(refused, "does not rotate")
    assert json.loads(ok(run(cli, v1, desk, "devices", "--json")).stdout) == json.loads(listed)
    revoked = ok(run(cli, v1, desk, "devices", "--revoke", laptop_id))
    assert "stay valid" in revoked.stdout and "upgrade" in revoked.stdout
    assert_user_error(run(cli, v1, laptop, "sync", "--retry-for", "1"), "this device was revoked")
