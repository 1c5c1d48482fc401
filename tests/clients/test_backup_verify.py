"""Backup sets checked without the passphrase (clients/verify.py): every kind of damage to a
folder of backups is found and named, and a damaged backup is restored only when forced."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import random
import shutil
import sqlite3
from collections.abc import Callable
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import pytest

from clients.backup import backup_replica, forget_backups, restore_replica
from clients.manifest import describe, read_manifest, row_name, taken_at, write_manifest
from clients.retention import KeepPolicy
from clients.rowdigests import rows_path
from clients.verify import verify_folder
from replica.errors import StoreError
from tests.clients.test_cli import Cli
from tests.conftest import ReplicaFactory

TRIALS = int(os.environ.get("SEALSYNC_DAMAGE_TRIALS", "25"))
"""Trials of each random kind of damage (issue 14 asks 100: set it)."""
Damage = Callable[[Path, random.Random], None]


@pytest.fixture
def pristine(make_replica: ReplicaFactory, tmp_path: Path) -> Path:
    """A folder of two good backups of a replica with some records."""
    replica = make_replica()
    for n in range(300):
        replica.put("threads", f"t{n}", {"title": f"thread {n}", "message_count": n})
    folder = tmp_path / "pristine"
    start = datetime.datetime(2026, 12, 2, tzinfo=datetime.UTC)
    for hours in (0, 1):
        replica.put("threads", f"at-{hours}", {"title": "differs from one backup to the next"})
        backup_replica(replica.path, folder, start + datetime.timedelta(hours=hours))
    replica.close()
    return folder


def backups(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.db"))


def flip_a_byte(path: Path, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def truncate(path: Path, rng: random.Random) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: rng.randrange(len(data))])


def in_backup(damage: Damage) -> Damage:
    return lambda folder, rng: damage(rng.choice(backups(folder)), rng)


def in_manifest(damage: Damage) -> Damage:
    return lambda folder, rng: damage(rng.choice(backups(folder)).with_suffix(".json"), rng)


def swap(first: Path, second: Path) -> None:
    temp = first.with_name("swapping")
    first.rename(temp)
    second.rename(first)
    temp.rename(second)


DAMAGE: dict[str, Damage] = {
    "flipped byte": in_backup(flip_a_byte),
    "flipped byte in a manifest": in_manifest(flip_a_byte),
    "truncation": in_backup(truncate),
    "missing backup": lambda folder, rng: rng.choice(backups(folder)).unlink(),
    "missing manifest": lambda folder, rng: (
        rng.choice(backups(folder)).with_suffix(".json").unlink()
    ),
    "flipped byte in row digests": lambda folder, rng: flip_a_byte(
        rng.choice(backups(folder)).with_suffix(".rows"), rng
    ),
    "missing row digests": lambda folder, rng: (
        rng.choice(backups(folder)).with_suffix(".rows").unlink()
    ),
    "extra file": lambda folder, rng: (folder / f"stray-{rng.randrange(1000)}.txt").touch(),
    "swapped backups": lambda folder, rng: swap(*backups(folder)),
    "swapped manifests": lambda folder, rng: swap(
        *(b.with_suffix(".json") for b in backups(folder))
    ),
}
RANDOM = ("flipped byte", "flipped byte in a manifest", "flipped byte in row digests", "truncation")


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_every_kind_of_damage_to_a_set_is_found_and_named(
    pristine: Path, tmp_path: Path, kind: str
) -> None:
    assert [v.state for v in verify_folder(pristine)] == ["ok", "ok"]
    for trial in range(TRIALS if kind in RANDOM else 1):
        folder = tmp_path / f"trial-{trial}"
        shutil.copytree(pristine, folder)
        DAMAGE[kind](folder, random.Random(trial))
        damaged = [v for v in verify_folder(folder) if v.state != "ok"]
        assert damaged, f"{kind}, trial {trial}: not found"
        assert all(v.state == "damaged" and v.problems for v in damaged)
        shutil.rmtree(folder)


def test_a_damaged_backup_is_restored_only_when_forced(
    cli: Cli, pristine: Path, tmp_path: Path
) -> None:
    backup = backups(pristine)[0]
    flip_a_byte(backup, random.Random(1))
    target = tmp_path / "restored.db"
    with pytest.raises(StoreError, match=r"damaged.*not what was written"):
        restore_replica(backup, target, force=True)  # --force replaces; it does not vouch
    assert not target.exists()
    restored = cli(target, "restore", str(backup), "--unverified")  # this bit: SQLite opens it
    assert restored.exit_code == 0, restored.output
    assert "warning: restored as it is: the file is not what was written" in restored.stderr


def test_rows_of_the_wrong_type_are_damage_not_a_crash(pristine: Path) -> None:
    backup = backups(pristine)[0]
    with sqlite3.connect(backup) as db:
        db.execute("UPDATE versions SET node = 1.5 WHERE id = (SELECT min(id) FROM versions)")
    (verdict,) = [v for v in verify_folder(pristine) if v.backup == backup]
    assert verdict.state == "damaged"
    assert any("is damaged" in p for p in verdict.problems), verdict.problems


@pytest.mark.parametrize("folder_name", ["b#1", "b?x", "b%41", "with space"])
def test_folders_with_uri_characters_hold_good_backups(
    make_replica: ReplicaFactory, tmp_path: Path, folder_name: str
) -> None:
    replica = make_replica()
    replica.put("threads", "t", {"title": "kept"})
    folder = tmp_path / folder_name
    backup = backup_replica(replica.path, folder, datetime.datetime.now(datetime.UTC))
    assert [v.state for v in verify_folder(folder)] == ["ok"]
    target = tmp_path / "restored" / "r.db"
    restore_replica(backup, target, force=False)
    made = {p.name for p in tmp_path.iterdir() if not p.name.startswith(replica.path.name)}
    assert made == {folder_name, "restored"}  # nothing at a path cut short at "#" or "?"


def test_a_hidden_replicas_backups_are_named_plainly_and_checked(
    cli: Cli, make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    replica = make_replica()
    hidden = tmp_path / ".notes.db"
    replica.close()
    replica.path.rename(hidden)
    folder = tmp_path / "backups"
    backup = backup_replica(hidden, folder, datetime.datetime.now(datetime.UTC))
    assert backup.name.startswith("notes-all-")
    (folder / "old").mkdir()  # a folder in the set is no damage
    assert [v.state for v in verify_folder(folder)] == ["ok"]
    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (empty, tmp_path / "no-such-backup.db"):
        result = cli(hidden, "backup", "verify", str(path))
        assert result.exit_code == 1 and "error:" in result.stderr, result.output


def test_verify_exits_3_and_names_the_damage(cli: Cli, pristine: Path, tmp_path: Path) -> None:
    replica = tmp_path / "any.db"  # verify needs no replica
    assert cli(replica, "backup", "verify", str(pristine)).exit_code == 0
    backups(pristine)[1].with_suffix(".json").unlink()
    result = cli(replica, "backup", "verify", str(pristine))
    assert result.exit_code == 3, result.output
    assert "no manifest" in result.stdout


def test_forget_removes_what_no_rule_keeps_and_never_counts_a_bad_backup(
    cli: Cli, make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    replica = make_replica()
    folder = tmp_path / "set"
    start = datetime.datetime(2026, 11, 1, 12, tzinfo=datetime.UTC)
    made = []
    for day in range(5):
        replica.put("threads", f"t{day}", {"title": f"day {day}"})
        made.append(backup_replica(replica.path, folder, start + datetime.timedelta(days=day)))
    newest_bad = made[-1]
    flip_a_byte(newest_bad, random.Random(3))  # the newest backup failed: it must not count
    dry = cli(replica.path, "backup", "forget", str(folder), "--keep-last", "2", "--dry-run")
    assert dry.exit_code == 0 and "would remove" in dry.stdout, dry.output
    assert len(list(folder.glob("*.db"))) == 5
    done = cli.json_object(
        replica.path, "backup", "forget", str(folder), "--keep-last", "2", "--json"
    )
    assert done["kept"] == [made[2].name, made[3].name]
    assert done["removed"] == [made[0].name, made[1].name]
    assert done["left_alone"] == [newest_bad.name]
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        n
        for b in (made[2], made[3], newest_bad)
        for n in (b.name, b.with_suffix(".json").name, b.with_suffix(".rows").name)
    )
    nothing = cli(replica.path, "backup", "forget", str(folder))
    assert nothing.exit_code == 1 and "needs a rule" in nothing.stderr


def test_forget_keeps_each_replicas_backups_apart(
    make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    folder = tmp_path / "shared"
    start = datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC)
    work, home = make_replica("work"), make_replica("home")
    made = [
        backup_replica(r.path, folder, start + datetime.timedelta(hours=h))
        for h, r in enumerate((work, home, work))
    ]
    done = forget_backups(folder, KeepPolicy(last=1), dry_run=False)
    assert done.kept == sorted([made[1].name, made[2].name])  # home's only backup stays
    assert done.removed == [made[0].name]


def test_a_manifest_whose_time_has_no_zone_is_damage(pristine: Path) -> None:
    backup = backups(pristine)[0]
    path = backup.with_suffix(".json")
    manifest = read_manifest(path)
    write_manifest(replace(manifest, taken_at="2026-12-02T00:00:00"), path)
    (verdict,) = [v for v in verify_folder(pristine) if v.backup == backup]
    assert verdict.state == "damaged" and "not a time with its zone" in verdict.problems[0]
    done = forget_backups(pristine, KeepPolicy(last=1), dry_run=True)
    assert done.left_alone == [backup.name]


def test_a_manifest_field_of_the_wrong_type_is_named(pristine: Path) -> None:
    backup = backups(pristine)[0]
    path = backup.with_suffix(".json")
    write_manifest(replace(read_manifest(path), bytes="7"), path)  # type: ignore[arg-type]
    (verdict,) = [v for v in verify_folder(pristine) if v.backup == backup]
    assert verdict.state == "damaged"
    assert "Expected `int`, got `str` - at `$.bytes`" in verdict.problems[0]


def rewrite_manifest(backup: Path) -> None:
    """Write the backup's manifest again to match what the file holds now (what a forger
    can do: a manifest is no defence against one)."""
    old = read_manifest(backup.with_suffix(".json"))
    rows_path(backup).unlink()
    again = describe(backup, backup.name, int(old.node, 16), taken_at(old, backup), old.scope,
                     digests_to=rows_path(backup))  # fmt: skip
    write_manifest(again, backup.with_suffix(".json"))


def _change_an_envelope(backup: Path) -> str:
    """Flip the last byte of one envelope (its tag) in `backup`; the row's manifest name."""
    with closing(sqlite3.connect(backup)) as db, db:
        key, node, hlc, envelope = db.execute(
            "SELECT key, node, hlc, envelope FROM versions ORDER BY id LIMIT 1 OFFSET 7"
        ).fetchone()
        changed = envelope[:-1] + bytes([envelope[-1] ^ 1])
        db.execute("UPDATE versions SET envelope = ? WHERE key = ?", (changed, key))
    return row_name(key, node, hlc)


def test_a_changed_envelope_is_named_by_its_row(pristine: Path) -> None:
    backup = backups(pristine)[0]
    name = _change_an_envelope(backup)
    (verdict,) = [v for v in verify_folder(pristine) if v.backup == backup]
    assert verdict.state == "damaged"
    assert f"versions row {name}: its envelope changed since the backup" in verdict.problems


def test_read_data_opens_every_envelope_and_tells_a_wrong_key(
    cli: Cli, pristine: Path, tmp_path: Path
) -> None:
    """A backup whose manifest was written again to match a changed envelope passes the
    check without the key; with it, the envelope does not authenticate, and is named."""
    replica = tmp_path / "any.db"
    verify = ("backup", "verify", str(pristine), "--read-data")
    assert cli(replica, *verify).exit_code == 0
    wrong = cli(replica, *verify, passphrase="not the passphrase")
    assert wrong.exit_code == 4 and wrong.stdout.count("wrong_key:") == 2, wrong.output
    backup = backups(pristine)[0]
    name = _change_an_envelope(backup)
    rewrite_manifest(backup)
    assert [v.state for v in verify_folder(pristine)] == ["ok", "ok"]
    result = cli(replica, *verify, "--json")
    assert result.exit_code == 3, result.output
    damaged = [v for v in json.loads(result.stdout) if v["state"] == "damaged"]
    assert [v["backup"] for v in damaged] == [str(backup)]
    assert damaged[0]["problems"][0].startswith(f"versions row {name} is undecryptable")
    assert replica.exists() is False  # verify needs no replica, and makes none


def as_format_1(backup: Path) -> None:
    """Write the backup's manifest as sealsync wrote it before the `.rows` file: every row's
    digest in the manifest, by `row_name`."""
    path = backup.with_suffix(".json")
    fields = json.loads(path.read_bytes())
    with closing(sqlite3.connect(backup)) as db:
        fields["envelopes"] = {
            table: {
                row_name(k, n, h): hashlib.sha256(e).hexdigest()
                for k, n, h, e in db.execute(f"SELECT key, node, hlc, envelope FROM {table}")
            }
            for table in ("versions", "history")
        }
    for name in ("sealsync_backup", "self_sha256", "rows_sha256"):
        del fields[name]
    seal = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    document = {"sealsync_backup": 1, **fields, "self_sha256": seal}
    path.write_text(json.dumps(document, indent=2, sort_keys=True))
    rows_path(backup).unlink()


def test_a_backup_an_earlier_version_took_still_verifies_and_names_its_damage(
    pristine: Path,
) -> None:
    backup = backups(pristine)[0]
    as_format_1(backup)
    assert [v.state for v in verify_folder(pristine)] == ["ok", "ok"]
    name = _change_an_envelope(backup)
    (verdict,) = [v for v in verify_folder(pristine) if v.backup == backup]
    assert f"versions row {name}: its envelope changed since the backup" in verdict.problems


def test_a_replica_holding_a_row_of_the_wrong_types_is_backed_up_with_its_damage_named(
    make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    """A review found it: the row digests wrote such a row's key as `bytes(int)`."""
    replica = make_replica()
    replica.put("threads", "t", {"title": "kept"})
    replica.close()
    with closing(sqlite3.connect(replica.path)) as db, db:
        db.execute("UPDATE versions SET key = 4611686018427387904")  # bytes(it): no memory
    folder = tmp_path / "backups"
    backup_replica(replica.path, folder, datetime.datetime.now(datetime.UTC))
    (verdict,) = verify_folder(folder)
    assert verdict.state == "damaged"
    assert any("row 4611686018427387904" in p and "is damaged" in p for p in verdict.problems)
