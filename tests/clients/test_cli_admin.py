"""`devices`, `profiles` and `passwd` against a real relay process: each does its job, and
each user mistake is an `error:` with a `hint:` that changes nothing."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from clients.cli import main
from clients.cli.admin import HINT_BY_PASSWD_REFUSAL, change_passphrase
from clients.device import load_settings
from clients.errors import RelayRefusedError
from clients.http import RelayClient
from replica import Replica, passphrase_login_keys
from replica.wire import KeyBundleValue, PutKeyBundle
from tests.clients.test_cli import PASSPHRASE, Cli, assert_user_error, dump, listed_accounts
from tests.relay.server import RelayProcess

NEW_PASSPHRASE = "a new and longer passphrase"


def two_devices(cli: Cli, relay: RelayProcess, tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    cli.ok(a, "init", "--relay", relay.url, "--account", "ann", "--device-name", "desk")
    cli.ok(b, "join", "--relay", relay.url, "--account", "ann", "--device-name", "laptop")
    return a, b


def revoke(cli: Cli, replica: Path, device_id: str, *flags: str) -> Result:
    """`devices --revoke`, which rotates the keys of a version-2 account to NEW_PASSPHRASE."""
    env = {"SEALSYNC_PASSPHRASE": PASSPHRASE, "SEALSYNC_NEW_PASSPHRASE": NEW_PASSPHRASE,
           "XDG_CONFIG_HOME": str(cli.home / "config")}  # fmt: skip
    args = ["--replica", str(replica), "devices", "--revoke", device_id, *flags]
    result = cli.runner.invoke(main, args, env=env)
    assert result.exit_code == 0, result.output
    return result


def passwd(
    cli: Cli, replica: Path, *flags: str, new: str = NEW_PASSPHRASE, old: str = PASSPHRASE
) -> Result:
    env = {"SEALSYNC_PASSPHRASE": old, "SEALSYNC_NEW_PASSPHRASE": new,
           "XDG_CONFIG_HOME": str(cli.home / "config")}  # fmt: skip
    return cli.runner.invoke(main, ["--replica", str(replica), "passwd", *flags], env=env)


@pytest.mark.slow
def test_devices_lists_the_account_marks_this_one_and_revokes_another(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    a, b = two_devices(cli, start_relay(), tmp_path)
    listed = cli.json_objects(a, "devices")
    by_name = {d["name"]: d for d in listed}
    assert set(by_name) == {"desk", "laptop"}
    assert by_name["desk"]["current"] and not by_name["laptop"]["current"]
    desk_id, laptop_id = by_name["desk"]["id"], by_name["laptop"]["id"]
    assert isinstance(desk_id, str) and isinstance(laptop_id, str), listed
    table = cli.ok(a, "devices").stdout
    assert "laptop" in table and "* this device" in table

    assert_user_error(cli(a, "devices", "--revoke", desk_id), "this device")
    assert_user_error(cli(a, "devices", "--revoke", "no-such-device"), "no device")
    assert len(cli.json_objects(a, "devices")) == 2

    revoked = revoke(cli, a, laptop_id, "--json")
    assert "revoked" in revoked.stderr and "rotated" in revoked.stderr
    assert [d["name"] for d in json.loads(revoked.stdout)] == ["desk"]  # stdout is JSON only
    assert [d["name"] for d in cli.json_objects(a, "devices")] == ["desk"]
    before = dump(b)
    assert_user_error(cli(b, "sync", "--retry-for", "1"), "this device was revoked")
    assert dump(b) == before


@pytest.mark.slow
def test_a_profile_made_on_one_device_reaches_the_other(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    a, b = two_devices(cli, start_relay(), tmp_path)
    assert cli.ok(a, "profiles").stdout.split() == ["default"]
    assert cli.ok(a, "profiles", "--create", "work").stdout.split() == ["default", "work"]
    cli.ok(a, "put", "threads", "t", '{"title": "at work"}', "--profile", "work")
    cli.ok(a, "sync")
    cli.ok(b, "sync")
    assert cli.ok(b, "profiles").stdout.split() == ["default", "work"]
    at_work = cli.json_object(b, "get", "threads", "t", "--profile", "work")
    assert at_work["doc"] == {"title": "at work"}

    before = dump(a)
    assert_user_error(cli(a, "profiles", "--create", "x" * 1000), "profile")
    assert_user_error(cli(a, "profiles", "--create", "y", passphrase="wrong"), "does not unlock")
    assert dump(a) == before


@pytest.mark.slow
def test_passwd_changes_the_passphrase_here_and_on_the_relay(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    relay = start_relay()
    a, b = two_devices(cli, relay, tmp_path)
    cli.ok(a, "put", "threads", "t", '{"title": "kept"}')
    cli.ok(a, "sync")
    before = dump(a)
    assert_user_error(passwd(cli, a, old="wrong passphrase"), "does not unlock")
    assert_user_error(passwd(cli, a, new=PASSPHRASE), "current one")
    assert dump(a) == before

    changed = passwd(cli, a)
    assert changed.exit_code == 0, changed.output
    assert_user_error(cli(a, "ls", "threads"), "does not unlock")
    assert cli(a, "ls", "threads", passphrase=NEW_PASSPHRASE).exit_code == 0
    c = tmp_path / "c.db"
    join = ["join", "--relay", relay.url, "--account", "ann"]
    assert_user_error(cli(c, *join), "bad_credentials")
    joined = cli(c, *join, passphrase=NEW_PASSPHRASE)
    assert joined.exit_code == 0, joined.output
    got = cli(c, "get", "threads", "t", "--json", passphrase=NEW_PASSPHRASE)
    assert '"kept"' in got.stdout

    # b still holds the old passphrase: the relay refuses it, and b's replica stays as it was
    before = dump(b)
    assert_user_error(passwd(cli, b, new="yet another passphrase"), "forbidden", "another")
    assert dump(b) == before


class RacedClient(RelayClient):
    """A relay client whose first read of the key bundle races another device's change."""

    raced = False

    def key_bundle(self, auth_key: bytes) -> KeyBundleValue:
        value = super().key_bundle(auth_key)
        if not self.raced:
            self.raced = True
            kdf = self.prelogin("ann").kdf
            auth = passphrase_login_keys(PASSPHRASE, kdf).auth_key
            self.put_key_bundle(PutKeyBundle(value.bundle, kdf, auth, value.version, auth))
        return value


@pytest.mark.slow
def test_passwd_that_loses_the_compare_and_set_race_changes_nothing(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    a, _ = two_devices(cli, start_relay(), tmp_path)
    before = dump(a)
    relay = load_settings(a)
    with Replica.open(a) as replica, RacedClient(relay.url, session=relay.session) as client:
        current = passphrase_login_keys(PASSPHRASE, replica.kdf_params())
        replica.unlock_with_login_keys(current)
        with pytest.raises(RelayRefusedError) as refused:
            change_passphrase(replica, client, current.auth_key, NEW_PASSPHRASE)
        assert refused.value.code == "version_conflict"
        assert "version_conflict" in HINT_BY_PASSWD_REFUSAL
    assert dump(a) == before
    assert cli(a, "ls", "threads").exit_code == 0


def test_logging_in_again_keeps_the_devices_one_entry(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    """Each `login` added another entry, so `devices` listed ghosts that revocation had to
    chase (issue 12): a device that logs in again is the device it was."""
    relay = start_relay()
    a = tmp_path / "a.db"
    cli.ok(a, "init", "--relay", relay.url, "--account", "ann")
    session = load_settings(a).session
    assert session is not None
    for _ in range(2):
        cli.ok(a, "login")
    listed = cli.json_objects(a, "devices")
    assert [(d["id"], d["current"]) for d in listed] == [(session.device_id, True)]
    again = load_settings(a).session
    assert again is not None and again.access_token != session.access_token


def test_passwd_can_end_every_other_devices_session(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    """A device may be in someone else's hands: `passwd --end-other-sessions` logs every other
    device out with the change, so none syncs again without the new passphrase."""
    relay = start_relay()
    a, b = two_devices(cli, relay, tmp_path)
    changed = passwd(cli, a, "--end-other-sessions")
    assert changed.exit_code == 0 and "every other device was logged out" in changed.stdout
    refused = cli(b, "sync", "--retry-for", "1")  # b holds no session any more
    assert_user_error(refused, "passphrase was changed on another device", "--recovery-key")
    synced = cli(a, "sync", passphrase=NEW_PASSPHRASE)  # this device goes on
    assert synced.exit_code == 0, synced.output
    assert_user_error(cli(b, "login"), "does not take this device's secret")  # the old one
    joined = cli(tmp_path / "c.db", "join", "--relay", relay.url, "--account", "ann",
                 passphrase=NEW_PASSPHRASE)  # fmt: skip
    assert joined.exit_code == 0, joined.output


def relay_accounts(cli: Cli, relay: RelayProcess, *args: str, input: str | None = None) -> Result:
    assert relay.db is not None
    return cli.runner.invoke(main, ["relay", "accounts", "--db", str(relay.db), *args], input=input)


@pytest.mark.slow
def test_an_operator_deletes_one_account_and_its_device_registers_it_again(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    """`relay accounts --delete NAME` (issue 12, item 6): asks first, deletes that account
    only, while the relay serves; the device then registers it again with `sync --reseed`."""
    relay = start_relay()
    a, _ = two_devices(cli, relay, tmp_path)
    bob = tmp_path / "bob.db"
    cli.ok(bob, "init", "--relay", relay.url, "--account", "bob")
    cli.ok(a, "put", "threads", "t1", '{"title": "kept on the device"}')
    cli.ok(a, "sync")
    before = listed_accounts(relay)
    assert before["ann"]["devices"] == 2 and before["ann"]["versions"] != 0

    assert_user_error(relay_accounts(cli, relay, "--delete", "nobody"), "no account 'nobody'")
    assert_user_error(relay_accounts(cli, relay, "--yes"), "--yes only goes with --delete")
    mixed = relay_accounts(cli, relay, "--delete", "ann", "--horizon-days", "90")
    assert_user_error(mixed, "--horizon-days goes with the listing")
    declined = relay_accounts(cli, relay, "--delete", "ann", input="n\n")
    assert declined.exit_code == 1 and "2 device(s)" in declined.stderr
    assert listed_accounts(relay) == before

    deleted = relay_accounts(cli, relay, "--delete", "ann", input="y\n")
    assert deleted.exit_code == 0, deleted.output
    assert "deleted account 'ann'" in deleted.stdout and "sync --reseed" in deleted.stdout
    assert listed_accounts(relay) == {"bob": before["bob"]}

    refused = cli(a, "sync")  # its tokens went with the account; the hint names the way back
    assert_user_error(refused, "does not have account 'ann'", "sync --reseed")
    again = cli.ok(a, "sync", "--reseed")
    assert "registered it again" in again.stderr + again.stdout
    after = listed_accounts(relay)
    assert after["ann"]["devices"] == 1 and after["ann"]["versions"] == before["ann"]["versions"]
    assert cli.json_object(a, "get", "threads", "t1")["doc"] == {"title": "kept on the device"}


def test_relay_accounts_shows_the_tombstones_devices_pushed_and_how_far_all_pulled(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    """Deleting on a device and syncing tells the relay which versions are tombstones, and
    each device's push says how far it pulled (`relay accounts`: `tombstones`, their bytes,
    and `ack_floor`, what every device has: the first step of tombstone collection)."""
    relay = start_relay()
    a, b = two_devices(cli, relay, tmp_path)
    for note in ("n1", "n2", "n3"):
        cli.ok(a, "put", "messages", note, '{"text": "hello"}')
    cli.ok(a, "rm", "messages", "n2")
    cli.ok(a, "sync")
    ann = listed_accounts(relay)["ann"]
    assert (ann["tombstones"], ann["ack_floor"]) == (1, None)  # b said nothing yet
    assert 0 < int(str(ann["tombstone_bytes"])) < int(str(ann["stored_bytes"]))
    cli.ok(b, "sync")  # it only pulled: an empty signed push says how far (3)
    assert listed_accounts(relay)["ann"]["ack_floor"] == 0  # a acked before it pulled
    cli.ok(b, "put", "messages", "from b", '{"text": "hi"}')
    cli.ok(b, "sync")  # its push acks the 3 versions it pulled
    cli.ok(a, "put", "messages", "n4", '{"text": "again"}')
    cli.ok(a, "sync")  # a pulled b's note before it pushed: it acks 4
    ann = listed_accounts(relay)["ann"]
    assert (ann["tombstones"], ann["ack_floor"], ann["head"]) == (1, 3, 5)
    ids = [session.device_id for d in (a, b) if (session := load_settings(d).session)]
    assert ann["held_back_by"] == min(ids)  # both acked 3: the first by id
    shown = relay_accounts(cli, relay)
    assert shown.exit_code == 0 and "acked" in shown.stdout


@pytest.mark.slow
def test_relay_collect_deletes_the_tombstones_every_device_acknowledged(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    """`relay collect` (docs/tombstone-collection.md §2) while the relay serves: the
    tombstone both devices pulled goes, with its bytes, and each device drops its own copy as
    it syncs past the run."""
    relay = start_relay()
    assert relay.db is not None
    a, b = two_devices(cli, relay, tmp_path)
    for note in ("n1", "n2", "n3"):
        cli.ok(a, "put", "messages", note, '{"text": "hello"}')
    cli.ok(a, "rm", "messages", "n2")
    cli.ok(a, "sync")
    cli.ok(b, "sync")  # pulls the three; says so in an empty signed push
    cli.ok(a, "put", "messages", "n4", '{"text": "again"}')
    cli.ok(a, "sync")  # its push acks what it had (3)
    before = listed_accounts(relay)["ann"]
    collect = ["relay", "collect", "--db", str(relay.db)]
    collected = cli.runner.invoke(main, [*collect, "--json"])
    assert collected.exit_code == 0, collected.output
    (ann,) = json.loads(collected.stdout)
    assert (ann["account"], ann["runs"], ann["versions"]) == ("ann", 1, 1)
    after = listed_accounts(relay)["ann"]
    assert (after["tombstones"], after["collected"]) == (0, 1)
    assert after["collected_bytes"] == before["tombstone_bytes"] == ann["bytes"]
    assert after["stored_bytes"] == int(str(before["stored_bytes"])) - int(str(ann["bytes"]))
    for device in (a, b):
        cli.ok(device, "sync")  # the page that ends at the run: each drops its copy
        assert "n1" in cli.ok(device, "ls", "messages").stdout
        status = cli.json_object(device, "status")
        assert (status["tombstones"], status["collected"]) == (0, 1)
    unknown = cli.runner.invoke(main, [*collect, "--account", "nobody"])
    assert unknown.exit_code == 1 and "no account 'nobody'" in unknown.output


def test_a_device_that_joins_after_a_collection_run_resyncs_first(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    """A device added after a run may be a copy of an older replica holding what the run's
    tombstones replaced: the relay flags it (`resync_required`), and its first sync (the
    join's) pulls everything again, asking for it, then acks the run and syncs as usual."""
    relay = start_relay()
    assert relay.db is not None
    a, b = two_devices(cli, relay, tmp_path)
    cli.ok(a, "put", "messages", "n1", '{"text": "kept"}')
    cli.ok(a, "put", "messages", "n2", '{"text": "deleted"}')
    cli.ok(a, "rm", "messages", "n2")
    for device in (a, b, a):
        cli.ok(device, "sync")
    collected = cli.runner.invoke(main, ["relay", "collect", "--db", str(relay.db), "--json"])
    (ann,) = json.loads(collected.stdout)
    assert ann["versions"] == 1, collected.output
    c = tmp_path / "c.db"
    joined = cli.ok(c, "join", "--relay", relay.url, "--account", "ann", "--device-name", "new")
    assert "1 pulled" in joined.stdout and "pulled everything" not in joined.stderr
    assert listed_accounts(relay)["ann"]["resyncing"] == 0  # flagged when added, then acked
    assert [r["id"] for r in cli.json_objects(c, "ls", "messages")] == ["n1"]
    cli.ok(c, "put", "messages", "n3", '{"text": "from c"}')
    cli.ok(c, "sync")
    cli.ok(a, "sync")
    assert "n3" in cli.ok(a, "ls", "messages").stdout


def test_relay_serve_collects_on_its_own_with_the_collect_setting(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    """With `collect` on, the relay runs collection every `collect_every_s` itself (here
    every second), with the horizon of `tombstone_horizon_days`, and logs what it freed."""
    relay = start_relay("collect=true", "collect_every_s=1", "tombstone_horizon_days=30")
    a, b = two_devices(cli, relay, tmp_path)
    cli.ok(a, "put", "messages", "n1", '{"text": "hello"}')
    cli.ok(a, "rm", "messages", "n1")
    for device in (a, b, a):
        cli.ok(device, "sync")
    deadline = time.monotonic() + 30
    while listed_accounts(relay)["ann"]["collected"] == 0:
        assert time.monotonic() < deadline, "no run within 30 s"
        time.sleep(0.2)
    logged = [json.loads(line) for line in relay.log_path.read_text().splitlines() if line]
    runs = [entry for entry in logged if entry["message"] == "tombstones collected"]
    assert runs and runs[0]["account"] == "ann" and runs[0]["versions"] == 1
    for device in (a, b):
        cli.ok(device, "sync")
        assert cli.json_object(device, "status")["collected"] == 1


def test_relay_collect_refuses_a_horizon_below_the_advertised_one(cli: Cli, tmp_path: Path) -> None:
    """Devices judge whether they may reseed a wiped relay by the horizon the relay tells
    them (`tombstone_horizon_days`); a run with a shorter one would leave out a device that
    counts itself in. `relay collect` refuses it, naming both, and takes one at the setting."""
    db = tmp_path / "relay.db"
    collect = ["relay", "collect", "--db", str(db), "--json", "--horizon-days"]
    refused = cli.runner.invoke(main, [*collect, "30"])
    assert_user_error(refused, "--horizon-days 30", "tombstone_horizon_days (90)", "at least 90")
    lowered = {"SEALSYNC_RELAY_TOMBSTONE_HORIZON_DAYS": "30"}
    taken = cli.runner.invoke(main, [*collect, "30"], env=lowered)
    assert taken.exit_code == 0, taken.output
    assert json.loads(taken.stdout) == []
