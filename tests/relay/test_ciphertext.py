"""Ciphertext only: devices write markers into record ids, collection names, profile names and
documents, and sync them through a real relay (uvicorn on 127.0.0.1, SQLite). A scan of the
relay's database files (with `-wal`) and its logs, as UTF-8, UTF-16 and base64, finds none of
them — while a marker the relay is meant to keep in the clear (a device name) is found."""

from __future__ import annotations

import base64
import secrets
from pathlib import Path

import pytest

from replica import Collection, Replica, Schema
from tests.conftest import Account
from tests.relay.driver import Device
from tests.relay.server import RelayProcess


def encodings(marker: str) -> list[bytes]:
    """The marker as the relay could hold it: UTF-8, UTF-16 both ways, and base64 at each of
    the three alignments (the inner characters that do not depend on the neighbours)."""
    raw = marker.encode()
    forms = [raw, marker.encode("utf-16-le"), marker.encode("utf-16-be")]
    for shift in range(3):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            encoded = encode(b"\0" * shift + raw)
            forms.append(encoded[4 : len(encoded) - 4])
    return forms


def found_in(marker: str, files: list[Path]) -> list[str]:
    hits = []
    for path in files:
        data = path.read_bytes()
        hits += [f"{path.name}: {form!r}" for form in encodings(marker) if form in data]
    return hits


def relay_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file())


@pytest.mark.slow
def test_the_relay_holds_no_plaintext_marker(tmp_path: Path, account: Account) -> None:
    secret = f"zq{secrets.token_hex(6)}"  # one marker, varied per place it is written
    places = {
        "collection": f"notes{secret}c",
        "profile": f"home{secret}p",
        "id": f"note{secret}i",
        "document": f"text {secret}d",
    }
    control = f"clear{secrets.token_hex(6)}"
    schema = Schema((Collection(places["collection"], "lww"),))
    replicas = []
    for name in ("a", "b"):
        replica = Replica.join(tmp_path / f"{name}.db", account.bundle, schema=schema)
        replica.unlock_with_key(account.key)
        replicas.append(replica)
    folder = tmp_path / "relay"
    folder.mkdir()
    with RelayProcess(folder / "relay.db", folder / "relay.log", accept_unsigned=True) as relay:
        first = Device.register(replicas[0], relay.url, "acct", f"laptop {control}")
        second = first.join(replicas[1], "phone")
        a, b = replicas
        a.create_profile(places["profile"])
        a.put(places["collection"], places["id"], {"body": places["document"]})
        a.put(places["collection"], "n2", {"t": places["document"]}, profile=places["profile"])
        first.sync()
        second.sync()
        first.close()
        second.close()
        secrets_in_clear = {
            "access token": first.session.access_token,
            "refresh token": second.session.refresh_token,
            "auth key": first.auth_key.hex(),
        }
        auth_key = first.auth_key
        assert b.get(places["collection"], places["id"]) is not None  # it did travel
        live_files = relay_files(folder)
        assert any(p.name.endswith("-wal") for p in live_files)
        for where, marker in places.items():
            assert found_in(marker, live_files) == [], f"{where} marker found in the relay"
        storage_id = first.session.state.storage_id
        relay.stop()  # graceful: the WAL is checkpointed into the main file
    files = relay_files(folder)
    for where, marker in places.items():
        assert found_in(marker, files) == [], f"{where} marker found after shutdown"
    for what, value in secrets_in_clear.items():  # tokens are stored hashed, never logged
        assert found_in(value, files) == [], f"{what} found in the relay's files or logs"
    assert not any(auth_key in p.read_bytes() for p in files), "raw auth key stored"
    # Positive controls: the scan does find what the relay keeps in the clear.
    assert [p.name for p in files] == ["relay.db", "relay.log"]  # shut down cleanly
    assert found_in(control, files)
    assert found_in(storage_id, [folder / "relay.log"])
    for replica in replicas:
        replica.close()
