"""The sync driver end to end over a real relay: convergence, chaos, rollback, live."""

from __future__ import annotations

import itertools
import json
import shutil
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from clients import sync as sync_module
from clients.cli import main
from clients.errors import RelayRefusedError, ResyncBusyError
from clients.http import RelayClient
from clients.keys import adopt_relay_keys, rotate_revoking
from clients.resurrection import DAY_MS
from clients.sync import Progress, SyncDriver, SyncReport, is_epoch_change
from replica import (
    RESYNC_LEASE,
    LoginKeys,
    Replica,
    ReplicaLockedError,
    Resynced,
    RollbackError,
    passphrase_login_keys,
)
from replica.wire import LoginRequest, parse_header
from tests.clients.chaos import ChaosTransport, FirstReplyLost
from tests.clients.conftest import FAST_BACKOFF, Device, Fleet, contents
from tests.clients.scenario import play
from tests.conftest import FakeClock
from tests.relay.server import RelayProcess

START_MS = int(time.time() * 1000) - 60_000
"""Both runs of the chaos test start their replicas' clocks here (behind the relay's)."""
CHAOS_STEPS = 400
"""Long enough for a few hundred requests, so 5% + 5% fault rates give dozens of faults."""


def push_counter(replica: Replica) -> int:
    with sqlite3.connect(replica.path) as db:
        row = db.execute("SELECT value FROM meta WHERE name = 'push_counter'").fetchone()
    return int(row[0])


def test_a_replica_whose_push_counter_went_back_signs_again_above_the_relays(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet]
) -> None:
    """A file restored from an older copy reuses counters the relay has seen: the relay
    answers `counter_stale` with its last one, and the device signs again above it — after
    a full resync, for the copy may predate a collection run and hold what it collected.
    (The restored file is opened afresh: a running session would go on with the counters it
    took before, which are above the relay's too.)"""
    relay = start_relay()
    device = fleets(relay.url).add("laptop")
    for round in range(3):
        device.replica.put("notes", f"n{round}", {"title": "signed"})
        assert device.driver.sync().stored == 1
    seen = push_counter(device.replica)
    with sqlite3.connect(device.replica.path) as db:
        db.execute("UPDATE meta SET value = 1 WHERE name = 'push_counter'")
    db.close()
    device.replica.put("notes", "after", {"title": "restored"})
    report = SyncDriver(device.replica, device.client).sync()
    assert (report.stored, report.refused, device.replica.status().dirty) == (1, 0, 0)
    assert report.resynced == Resynced(dropped=0, set_aside=0)
    assert push_counter(device.replica) > seen


def relay_contents(fleet: Fleet) -> tuple[list[tuple[bytes, int, int]], list[int], int]:
    """Every version the relay holds (identity per entry), their seqs and the head, read by
    a new device from cursor 0."""
    with RelayClient(fleet.url) as client:
        client.login(LoginRequest(fleet.account, fleet.auth_key, "auditor"))
        return relay_entries(client)


def relay_entries(client: RelayClient) -> tuple[list[tuple[bytes, int, int]], list[int], int]:
    """`relay_contents` through a client already logged in to the account."""
    identities, seqs, cursor = [], [], 0
    while True:
        page = client.pull(cursor)
        for entry in page.entries:
            header = parse_header(entry.envelope)
            identities.append((header.key, header.node, header.hlc))
            seqs.append(entry.seq)
        cursor = page.next_cursor
        if not page.has_more:
            return identities, seqs, page.state.head


@pytest.mark.slow
def test_three_devices_edit_offline_and_converge_with_siblings(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet]
) -> None:
    relay = start_relay()
    clock = FakeClock(START_MS)
    devices = play(fleets(relay.url, clock=clock), clock, seed=1)
    first = devices[0].replica
    for device in devices:
        replica = device.replica
        assert contents(replica) == contents(first)
        assert replica.scan("notes") == first.scan("notes")
        assert len(replica.conflicts("threads", "shared")) == 1  # two concurrent edits: siblings
        assert replica.get("threads", "shared") == first.get("threads", "shared")
        assert replica.status().dirty == 0
    assert any(r.deleted for r in first.scan("notes", include_deleted=True))


@pytest.mark.slow
def test_progress_names_each_step_of_every_batch_and_page_with_totals(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet]
) -> None:
    relay = start_relay("max_push_envelopes=2", "page_size=2")
    events: list[Progress] = []
    fleet = fleets(relay.url, driver_options={"progress": events.append})
    a, b = fleet.add("a"), fleet.add("b")
    for n in range(5):
        a.replica.put("notes", f"n{n}", {"text": str(n)})
    a.driver.sync()

    # Each batch goes out before the previous one's receipts are saved, each page before the
    # previous one merges: (phase, size, pushed so far) in that order.
    assert [(e.phase, e.size, e.pushed) for e in events] == [
        ("push_sending", 2, 0), ("push_answered", 2, 0),
        ("push_sending", 2, 0), ("receipts_saved", 2, 2), ("push_answered", 2, 2),
        ("push_sending", 1, 2), ("receipts_saved", 2, 4), ("push_answered", 1, 4),
        ("receipts_saved", 1, 5),
        # A's receipts moved its cursor over its own versions: one empty page (protocol §4.2)
        ("pull_sending", 0, 5), ("merge_start", 0, 5), ("merged", 0, 5)]  # fmt: skip
    assert {e.push_total for e in events} == {5}
    events.clear()
    b.driver.sync()
    assert [(e.phase, e.size) for e in events] == [
        ("pull_sending", 0), ("pull_sending", 0), ("merge_start", 2), ("merged", 2),
        ("pull_sending", 0), ("merge_start", 2), ("merged", 2),
        ("merge_start", 1), ("merged", 1)]  # fmt: skip
    assert [(e.pulled, e.pull_done, e.pull_total) for e in events if e.phase == "merged"] == [
        (2, 2, 5), (4, 4, 5), (5, 5, 5)]  # fmt: skip


@pytest.mark.slow
def test_no_batch_goes_out_once_an_answer_shows_the_relay_changed(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet]
) -> None:
    """A batch leaves before the previous one's receipts are saved, but never before the
    previous answer's relay state is checked: B reseeds while A's first batch is answered,
    A's second batch, signed for the old epoch, is refused and the relay's state read shows
    the new epoch, and A's third batch is never sent."""
    relay = start_relay("max_push_envelopes=2")
    events: list[Progress] = []

    def reseed_by_b_on_first_answer(progress: Progress) -> None:
        events.append(progress)
        if progress.phase == "push_answered" and progress.pushed == 0:
            b.client.reseed(fleet.auth_key)

    options = {"progress": reseed_by_b_on_first_answer, "follow_reseeds": False}
    fleet = fleets(relay.url, driver_options=options)
    a, b = fleet.add("a"), fleet.add("b")
    for n in range(8):
        a.replica.put("notes", f"n{n}", {"text": str(n)})

    with pytest.raises(RollbackError) as raised:
        a.driver.sync()

    assert is_epoch_change(raised.value)
    assert [e.phase for e in events].count("push_sending") == 2
    assert len(relay_contents(fleet)[0]) == 2  # the second batch was signed for the old epoch
    assert a.replica.status().dirty == 6


class Interrupted(Exception):
    """Stands for a Ctrl-C or any error on the round's thread."""


@pytest.mark.slow
def test_a_round_stopped_by_an_error_does_not_wait_for_the_request_in_flight(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet]
) -> None:
    """The relay dies as A's second batch goes out, so that push retries for up to 60 s; an
    error on A's own thread right then ends the sync at once. Run again once the relay is
    back: every version is on the relay exactly once."""
    relay = start_relay("max_push_envelopes=2")

    def die_then_interrupt(progress: Progress) -> None:
        steps.append(progress.phase)
        if steps.count("push_sending") == 2 and progress.phase == "push_sending":
            relay.kill()  # before the second batch leaves: its push will retry
        if progress.phase == "receipts_saved":
            raise Interrupted

    steps: list[str] = []
    fleet = fleets(relay.url, driver_options={"progress": die_then_interrupt})
    a = fleet.add("a")
    for n in range(6):
        a.replica.put("notes", f"n{n}", {"text": str(n)})

    started = time.monotonic()
    with pytest.raises(Interrupted):
        a.driver.sync()
    assert time.monotonic() - started < 5
    assert a.replica.status().dirty == 4

    relay.start()
    assert SyncDriver(a.replica, a.client).sync().pushed == 4
    identities, _, _ = relay_contents(fleet)
    assert len(identities) == len(set(identities)) == 6


@pytest.mark.slow
def test_a_page_fetched_ahead_is_dropped_when_the_cursor_moved_elsewhere(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet]
) -> None:
    """B's next page is on its way while B merges; when another sync of B's replica moved
    the cursor meanwhile, B pulls on from that cursor instead of merging pages again."""
    relay = start_relay("page_size=2")
    fleet = fleets(relay.url)
    a, b = fleet.add("a"), fleet.add("b")
    for n in range(5):
        a.replica.put("notes", f"n{n}", {"text": str(n)})
    a.driver.sync()
    other = RelayClient(fleet.url)
    other.login(LoginRequest(fleet.account, fleet.auth_key, "b-elsewhere"))
    elsewhere = SyncDriver(b.replica, other)

    def sync_elsewhere_on_first_merge(progress: Progress) -> None:
        if progress.phase == "merge_start" and progress.pulled == 0:
            assert elsewhere.sync().pulled == 5

    report = SyncDriver(b.replica, b.client, progress=sync_elsewhere_on_first_merge).sync()
    other.close()

    assert report.pulled == 2  # the first page only: then one empty page from cursor 5
    assert b.replica.sync_session().cursor == 5
    assert contents(b.replica) == contents(a.replica)


@pytest.mark.slow
def test_chaos_transport_and_a_relay_restart_change_nothing(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet]
) -> None:
    calm_relay = start_relay()
    calm_clock = FakeClock(START_MS)
    calm_fleet = fleets(calm_relay.url, clock=calm_clock)
    calm = play(calm_fleet, calm_clock, seed=7, steps=CHAOS_STEPS)

    relay = start_relay()
    restarts: list[threading.Thread] = []
    answered = itertools.count(1)

    def restart_later() -> None:
        time.sleep(0.5)
        relay.start()

    def restart_once(n: int) -> None:  # the relay dies right after its 40th answer of the run
        if next(answered) == 40:
            relay.kill()
            restarts.append(threading.Thread(target=restart_later))
            restarts[0].start()

    transports: list[ChaosTransport] = []

    def chaos() -> ChaosTransport:
        transports.append(
            ChaosTransport(
                seed=len(transports),
                strike=lambda n, path: path == "/v1/push" and n <= 3,  # a first reply lost
                on_request=restart_once,
            )
        )
        return transports[-1]

    clock = FakeClock(START_MS)
    stormy_fleet = fleets(relay.url, clock=clock, transport=chaos)
    stormy = play(stormy_fleet, clock, seed=7, steps=CHAOS_STEPS)
    for thread in restarts:
        thread.join(timeout=30)

    assert restarts, "the relay was restarted mid-run"
    faults = sum((t.faults for t in transports), start=Counter[str]())
    struck = {rid: fault for t in transports for rid, fault in t.struck.items()}
    logged = logged_by_relay(relay)  # counted on the relay's side: request id → status
    after_commit = [f for rid, f in struck.items() if 200 <= logged.get(rid, 0) < 300]
    assert len(struck) >= 20, faults
    assert len(after_commit) >= len(struck) / 2, (after_commit, faults)
    assert any(fault.endswith("/v1/push") for fault in after_commit), after_commit
    unsent = [rid for rid, fault in struck.items() if fault.startswith("unsent")]
    assert unsent and not any(rid in logged for rid in unsent), faults  # never reached it
    for mine, theirs in zip(stormy, calm, strict=True):
        assert contents(mine.replica, with_nodes=False) == contents(
            theirs.replica, with_nodes=False
        )
    identities, seqs, head = relay_contents(stormy_fleet)
    calm_identities, _, calm_head = relay_contents(calm_fleet)
    assert len(set(identities)) == len(identities) and len(set(seqs)) == len(seqs)
    assert (len(identities), head) == (len(calm_identities), calm_head)  # 0 lost, 0 duplicated


def logged_requests(relay: RelayProcess) -> list[dict[str, Any]]:
    """Every request the relay logged (its debug request log)."""
    entries = (json.loads(line) for line in relay.log_path.read_text().splitlines()
               if line.startswith("{"))  # fmt: skip
    return [entry for entry in entries if entry.get("message") == "request"]


def logged_by_relay(relay: RelayProcess) -> dict[str, int]:
    """Request id → status of every request the relay logged with an id."""
    return {e["request_id"]: e["status"] for e in logged_requests(relay) if e.get("request_id")}


def relay_statuses(relay: RelayProcess) -> list[int]:
    return [int(entry["status"]) for entry in logged_requests(relay)]


def synced_pair(relay: RelayProcess, fleets: Callable[..., Fleet]) -> tuple[Fleet, Device, Device]:
    """Devices a and b on `relay`, both synced after a wrote `n1`."""
    fleet = fleets(relay.url)
    a, b = fleet.add("a"), fleet.add("b")
    a.replica.put("notes", "n1", {"text": "one"})
    a.driver.sync()
    b.driver.sync()
    return fleet, a, b


@pytest.mark.slow
def test_a_reseed_is_followed_and_a_rollback_by_head_reseeds_with_a_new_epoch(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet], tmp_path: Path
) -> None:
    relay = start_relay()
    fleet, a, b = synced_pair(relay, fleets)

    a.driver.reseed(fleet.auth_key)  # a asks for a new epoch; b follows, on its own
    b.replica.put("notes", "n2", {"text": "offline on b"})
    report = b.driver.sync()
    assert report.rounds == 2 and b.replica.status().dirty == 0
    a.driver.sync()
    assert a.replica.get("notes", "n2") is not None

    relay.stop()  # the operator keeps a copy, later restores it: same epoch, lower head
    db = relay.db
    assert db is not None
    shutil.copy(db, tmp_path / "old.db")
    relay.start()
    a.replica.put("notes", "n3", {"text": "three"})
    a.driver.sync()
    b.driver.sync()
    relay.stop()
    shutil.copy(tmp_path / "old.db", db)
    for suffix in ("-wal", "-shm"):
        db.with_name(db.name + suffix).unlink(missing_ok=True)
    relay.start()

    with pytest.raises(RollbackError) as found:
        b.driver.sync()
    assert not is_epoch_change(found.value) and "below" in str(found.value)
    assert b.replica.get("notes", "n3") is not None  # nothing read as deleted
    b.driver.reseed(fleet.auth_key, found.value)  # by head: a new epoch, all pushed again
    assert a.driver.sync().rounds == 2  # a follows the new epoch
    late = fleet.add("c")
    late.driver.sync()
    for device in (a, b, late):
        assert contents(device.replica) == contents(a.replica)
        assert sorted(r.id for r in device.replica.scan("notes")) == ["n1", "n2", "n3"]


def test_a_reseed_whose_reply_was_lost_draws_one_new_epoch(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet]
) -> None:
    """Each POST /v1/reseed draws an epoch: a blind resend would make every other device
    reseed twice."""
    relay = start_relay()
    first_reseed = FirstReplyLost("/v1/reseed")
    fleet = fleets(relay.url, transport=first_reseed)
    a = fleet.add("a")
    a.replica.put("notes", "n1", {"text": "one"})
    a.driver.sync()
    report = a.driver.reseed(fleet.auth_key)
    reseeds = [
        line for line in relay.log_path.read_text().splitlines() if "account reseeded" in line
    ]
    assert first_reseed.lost and len(reseeds) == 1, (
        reseeds
    )  # the lost reply was not answered by a resend
    assert report.stored == 1  # and the device pushed everything again


@pytest.mark.slow
@pytest.mark.parametrize(
    "poll_interval_s",
    [0.5, pytest.param(60.0, id="feed-only")],
)
def test_a_watching_device_sees_writes_live_and_across_a_relay_restart(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet], poll_interval_s: float
) -> None:
    """With polling every 60 s (and no idle sync before then) only the live feed, followed
    again after the relay restarts, can bring the writes within the 15 s waited."""
    relay = start_relay("heartbeat_s=0.5")
    fleet = fleets(relay.url)
    a, b = fleet.add("a"), fleet.add("b")
    stop = threading.Event()
    failure: list[BaseException] = []

    def watch() -> None:
        try:
            b.driver.watch(stop, poll_interval_s=poll_interval_s, idle_sync_s=60)
        except BaseException as exc:
            failure.append(exc)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        a.replica.put("notes", "live", {"text": "hello"})
        a.driver.sync()
        assert wait_for(b, "live", timeout_s=15), "b did not see a's write"
        relay.kill()
        relay.start()
        a.replica.put("notes", "after", {"text": "again"})
        a.driver.sync()
        assert wait_for(b, "after", timeout_s=15), "b did not see a's write after the restart"
    finally:
        stop.set()
        watcher.join(timeout=10)
    assert not watcher.is_alive() and not failure, failure


def wait_for(device: Device, record: str, timeout_s: float = 20) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if device.replica.get("notes", record) is not None:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_a_watch_that_meets_newer_keys_pulls_only_and_keeps_its_writes(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet]
) -> None:
    """Another device rotated the keys (revoking a third): a watch cannot ask for the new
    passphrase, so instead of ending it stops pushing, keeps pulling, and says so."""
    relay = start_relay()
    fleet = fleets(relay.url)
    a, b, c = fleet.add("a"), fleet.add("b"), fleet.add("c")
    revoked = c.client.session.device_id if c.client.session else ""
    rotate_revoking(a.client, a.replica, LoginKeys(fleet.auth_key, b""), "a new passphrase, long "
                    "enough", revoked, catch_up=a.driver.sync)  # fmt: skip
    b.replica.put("notes", "mine", {"text": "written before b heard of it"})
    a.replica.put("notes", "theirs", {"text": "under the new keys"})
    a.driver.sync()
    reports: list[SyncReport] = []
    stop = threading.Event()

    kdf = b.client.prelogin(fleet.account).kdf
    new_login = passphrase_login_keys("a new passphrase, long enough", kdf)

    def after_two_rounds(report: SyncReport) -> None:
        reports.append(report)
        if len(reports) == 2:  # `sealsync sync` takes the new keys, in another process
            with Replica.open(b.replica.path) as other:
                other.unlock_with_key(b.replica.unlock_key())
                assert adopt_relay_keys(b.client, other, new_login)

    with pytest.raises(ReplicaLockedError, match="changed since it was unlocked"):
        b.driver.watch(stop, poll_interval_s=0.1, idle_sync_s=0.2, on_report=after_two_rounds)
    assert len(reports) == 2
    assert all(report.pushing_paused and report.pushed == 0 for report in reports)
    assert reports[0].held == 1  # a's write, under an epoch b does not have yet
    assert b.replica.status().dirty == 1  # re-sealed by the other process, still to go out
    with pytest.raises(ReplicaLockedError):  # its keys are stale, its record is not damaged
        b.replica.get("notes", "mine")
    assert b.replica.status().degraded == 0


def test_a_sync_behind_another_processes_resync_gives_up_for_now_and_retries(
    start_relay: Callable[..., RelayProcess],
    fleets: Callable[..., Fleet],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restored file resyncs before it pushes, one process at a time (the lease): a round
    that finds another process's resync under way waits, then gives up for now with a
    retryable error (a watch tries again at its next wake), and resyncs once it is done."""
    relay = start_relay()
    device = fleets(relay.url).add("laptop")
    device.replica.put("notes", "n", {"title": "kept"})
    device.driver.sync()
    device.replica.take_new_node_id()  # what `restore` does: the next sync resyncs first
    monkeypatch.setattr(sync_module, "RESYNC_WAIT_S", 0.2)
    with device.replica.lease(RESYNC_LEASE), pytest.raises(ResyncBusyError) as caught:
        device.driver.sync()  # while another process's resync holds the lease
    assert caught.value.retryable and caught.value.hint == "sync again once it is done"
    report = device.driver.sync()
    assert report.resynced is not None and device.replica.get("notes", "n") is not None


@pytest.mark.slow
def test_a_watch_waiting_for_a_resync_stops_when_told_and_outlives_a_lock(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet]
) -> None:
    """A watch behind another process's resync gives up waiting as soon as it is told to
    stop, not after `RESYNC_WAIT_S`; and a replica locked while it must resync waits for
    its unlock (a retryable `ResyncBusyError`) instead of ending the watch."""
    relay = start_relay()
    device = fleets(relay.url).add("laptop")
    device.replica.put("notes", "n", {"title": "kept"})
    device.driver.sync()
    device.replica.take_new_node_id()  # the next round resyncs first
    stop = threading.Event()
    watch = threading.Thread(target=device.driver.watch, args=(stop,), daemon=True)
    with device.replica.lease(RESYNC_LEASE):  # another process's resync
        watch.start()
        time.sleep(0.5)
        stop.set()
        told = time.monotonic()
        watch.join(timeout=30)
        waited = time.monotonic() - told
    assert not watch.is_alive() and waited < sync_module.RESYNC_WAIT_S / 4, waited

    key = device.replica.unlock_key()
    device.replica.lock()
    with pytest.raises(ResyncBusyError) as caught:
        device.driver.sync()
    assert caught.value.retryable and caught.value.hint == "unlock it, then sync"
    stop = threading.Event()
    reports: list[SyncReport] = []
    watch = threading.Thread(
        target=device.driver.watch,
        args=(stop,),
        kwargs={"poll_interval_s": 0.1, "idle_sync_s": 0.2, "on_report": reports.append},
        daemon=True,
    )
    watch.start()
    time.sleep(1)
    assert watch.is_alive() and reports == []  # waiting, not ended
    device.replica.unlock_with_key(key)
    deadline = time.monotonic() + 20
    while not reports and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    watch.join(timeout=30)
    assert reports and reports[0].resynced is not None
    assert device.replica.get("notes", "n") is not None


@pytest.mark.slow
def test_a_device_away_past_the_horizon_follows_a_reseed_by_pulling_everything_again(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet]
) -> None:
    """Another device reseeded (an epoch change) while b was away past the relay's tombstone
    horizon: b adopts the relay — a full resync — instead of pushing everything it holds (a
    relay restored from an older copy may lack the flag that would make it resync); what it
    wrote while away still goes out."""
    relay = start_relay()
    fleet, a, b = synced_pair(relay, fleets)
    with sqlite3.connect(b.replica.path) as db:  # its last ack, 100 days ago (horizon: 90)
        db.execute("UPDATE meta SET value = value - ? WHERE name = 'acked_ms'", (100 * DAY_MS,))
    a.driver.reseed(fleet.auth_key)
    b.replica.put("notes", "n2", {"text": "written while away"})
    report = b.driver.sync()
    assert report.rounds == 2 and report.resynced is not None
    assert b.replica.status().dirty == 0
    a.driver.sync()
    assert sorted(r.id for r in a.replica.scan("notes")) == ["n1", "n2"]


@pytest.mark.slow
def test_a_paused_watch_the_relay_asks_to_resync_keeps_watching(
    start_relay: Callable[..., RelayProcess],
    fleets: Callable[..., Fleet],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """b's watch pulls only (the keys were rotated on a), and b was left out of a collection
    run (silent 100 days): the relay refuses its plain pulls `resync_required`, and the
    resync it starts ends with an ack under keys it does not have. The watch says to run
    `sealsync sync` and keeps watching, instead of ending on the refusal."""
    relay = start_relay()
    assert relay.db is not None
    fleet = fleets(relay.url)
    a, b, c = fleet.add("a"), fleet.add("b"), fleet.add("c")
    a.replica.put("notes", "gone", {"text": "deleted while b was away"})
    a.driver.sync()
    b.driver.sync()
    revoked = c.client.session.device_id if c.client.session else ""
    rotate_revoking(a.client, a.replica, LoginKeys(fleet.auth_key, b""), "a new passphrase, long "
                    "enough", revoked, catch_up=a.driver.sync)  # fmt: skip
    a.replica.delete("notes", "gone")
    a.driver.sync()
    SyncDriver(a.replica, a.client).sync()  # a new session acks past the tombstone
    b_id = b.client.session.device_id if b.client.session else ""
    with sqlite3.connect(relay.db) as db:
        aged = db.execute(
            "UPDATE devices SET ack_ms = ack_ms - ?, created_ms = created_ms - ? WHERE id = ?",
            (100 * DAY_MS, 100 * DAY_MS, b_id),
        )
        assert aged.rowcount == 1
    collect = ["relay", "collect", "--db", str(relay.db), "--horizon-days", "90", "--json"]
    ran = CliRunner().invoke(main, collect)
    assert ran.exit_code == 0 and json.loads(ran.stdout)[0]["flagged"] == 1, ran.output

    stop = threading.Event()
    watch = threading.Thread(
        target=b.driver.watch, args=(stop,), kwargs={"poll_interval_s": 0.1, "idle_sync_s": 0.2}
    )
    with caplog.at_level("WARNING", logger="sealsync"):
        watch.start()
        deadline = time.monotonic() + 20
        while "run `sealsync sync`" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        assert watch.is_alive()  # still watching
        stop.set()
        watch.join(timeout=30)
    assert not watch.is_alive() and "pull everything again" in caplog.text


@pytest.mark.slow
def test_a_file_restored_from_an_older_copy_of_itself_drops_what_a_run_collected_since(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet], tmp_path: Path
) -> None:
    """a's file is copied (a disk backup), then `gone` is deleted on b and a collection run
    takes it, released once both devices passed it. The copy, opened as a again, would never
    see that run's markers and keep `gone` for good; the relay's `counter_stale` shows it
    is an older copy, so it resyncs, and drops `gone`."""
    relay = start_relay()
    assert relay.db is not None
    fleet = fleets(relay.url)
    a, b = fleet.add("a"), fleet.add("b")
    a.replica.put("notes", "kept", {"text": "kept"})
    a.replica.put("notes", "gone", {"text": "deleted later"})
    a.driver.sync()
    b.driver.sync()
    copy = tmp_path / "a-copy.db"
    with sqlite3.connect(a.replica.path) as live, sqlite3.connect(copy) as backup:
        live.backup(backup)
    a.replica.put("notes", "later", {"text": "written after the copy"})
    b.replica.delete("notes", "gone")
    collect = ["relay", "collect", "--db", str(relay.db), "--json"]
    for _ in range(2):  # a run, then its release: each device syncing (and acking) first
        for device in (b, a, b, a):
            SyncDriver(device.replica, device.client).sync()
        assert CliRunner().invoke(main, collect).exit_code == 0
    restored = Replica.open(copy)
    try:
        restored.unlock_with_key(a.replica.unlock_key())
        assert restored.get("notes", "gone") is not None
        report = SyncDriver(restored, a.client).sync()
        assert report.resynced is not None
        assert sorted(r.id for r in restored.scan("notes")) == ["kept", "later"]
    finally:
        restored.close()


@pytest.mark.slow
def test_two_sessions_on_one_file_sign_above_each_other_without_resyncing(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet]
) -> None:
    """Two sessions on one file (two processes) each take a block of counters: the one with
    the lower block meets `counter_stale` at its next push. The file itself is not behind
    the relay, so it is no older copy: it signs above and pushes, with no full resync."""
    relay = start_relay()
    device = fleets(relay.url).add("laptop")
    other = SyncDriver(device.replica, device.client, backoff=FAST_BACKOFF)
    resyncs = 0
    for i in range(4):
        for driver in (device.driver, other):
            device.replica.put("notes", f"n{i}-{id(driver)}", {"t": i})
            report = driver.sync()
            assert report.stored == 1
            resyncs += report.resynced is not None
    assert resyncs == 0
    assert 409 in relay_statuses(relay)  # a `counter_stale` was met, and signed above


@pytest.mark.slow
def test_a_row_held_for_drift_and_pushed_by_a_reseed_covers_no_later_own_write(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet]
) -> None:
    """The phone's clock is 30 days ahead: the laptop holds its write for drift, and a
    reseed pushes that held row. The mark of what was offered counts only the laptop's own
    rows, so its next write, far below the phone's hlc, is pushed by a later resync."""
    relay = start_relay(f"max_drift_ms={60 * DAY_MS}")
    fleet = fleets(relay.url)
    laptop = fleet.add("laptop")
    fleet.clock = FakeClock(int(time.time() * 1000) + 30 * DAY_MS)
    phone = fleet.add("phone")
    fleet.clock = None
    laptop.driver.sync()
    phone.replica.put("notes", "p", {"t": "from the phone"})
    phone.driver.sync()
    laptop.driver.sync()
    assert laptop.replica.status().held_for_drift == 1
    laptop.driver.reseed(fleet.auth_key)
    laptop.replica.put("notes", "y", {"t": "written after the reseed"})
    with sqlite3.connect(laptop.replica.path) as db:  # a resync is due (an adoption, say)
        db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('resync_needed', 1)")
    report = laptop.driver.sync()
    assert report.resynced is not None and laptop.replica.set_aside() == []
    phone.driver.sync()
    assert phone.replica.get("notes", "y") is not None


def offered_through(replica: Replica) -> int:
    with sqlite3.connect(replica.path) as db:
        row = db.execute("SELECT value FROM meta WHERE name = 'offered_through'").fetchone()
    return 0 if row is None else int(row[0])


def test_a_batch_refused_for_the_quota_still_counts_as_offered(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet]
) -> None:
    """The relay refused a's batch for its quota, storing none of it; the mark of what was
    offered stays above its rows all the same: another session on the file may have offered
    them too, and its push may have been stored. A full resync later sets them aside
    (`aside --take` brings them back) rather than risk pushing back what a run collected."""
    relay = start_relay("max_account_bytes=4000")
    fleet = fleets(relay.url)
    a = fleet.add("a")
    a.replica.put("notes", "small", {"text": "fits"})
    a.driver.sync()
    marked = offered_through(a.replica)
    a.replica.put("notes", "big", {"text": "x" * 5000})
    with pytest.raises(RelayRefusedError, match="quota"):
        a.driver.sync()
    big = a.replica.get("notes", "big")
    assert big is not None and 0 < marked < big.hlc <= offered_through(a.replica)
