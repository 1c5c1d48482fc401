"""The power-cut simulator's own model (tests/faults/crashsim.py), against a plain replay of
the same writes: what `drop` and `keep` leave, what `torn` may touch, and the parse of
strace's lines."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from tests.faults.crashsim import SECTOR, Call, FileState, Mode, parse, replay

PATH = "/data/replica.db-wal"
writes = st.builds(
    lambda offset, data: Call("pwrite64", PATH, data, offset=offset),
    st.integers(0, 3 * SECTOR),
    st.binary(min_size=1, max_size=2 * SECTOR),
)
calls = st.lists(
    st.one_of(
        writes,
        st.builds(lambda size: Call("ftruncate", PATH, size=size), st.integers(0, 4 * SECTOR)),
        st.just(Call("sync", PATH)),
    ),
    max_size=12,
)


def plain(history: list[Call]) -> bytearray:
    """The file as the process sees it after `history`."""
    content = bytearray()
    for call in history:
        if call.name == "ftruncate":
            content = content[: call.size] + bytes(max(0, call.size - len(content)))
        elif call.name == "pwrite64":
            end = call.offset + len(call.data)
            content.extend(bytes(max(0, end - len(content))))
            content[call.offset : end] = call.data
    return content


def last_sync(history: list[Call]) -> int:
    return max((i + 1 for i, call in enumerate(history) if call.name == "sync"), default=0)


def state_after(history: list[Call]) -> FileState:
    state = FileState()
    for call in history:
        state.sync() if call.name == "sync" else state.apply(call)
    return state


@given(calls)
def test_keep_is_what_the_process_wrote_and_drop_what_it_synced(history: list[Call]) -> None:
    state = state_after(history)
    rng = random.Random(0)
    assert state.image(Mode.KEEP, rng) == plain(history)
    assert state.image(Mode.DROP, rng) == plain(history[: last_sync(history)])


@given(st.lists(writes, max_size=6), st.lists(writes, min_size=1, max_size=6), st.integers())
def test_torn_touches_only_sectors_written_since_the_sync(
    synced: list[Call], unsynced: list[Call], seed: int
) -> None:
    state = state_after([*synced, Call("sync", PATH), *unsynced])
    durable = plain(synced)
    torn = state.image(Mode.TORN, random.Random(seed))
    touched = {
        sector
        for call in unsynced
        for sector in range(call.offset // SECTOR, (call.offset + len(call.data) - 1) // SECTOR + 1)
    }
    for sector in set(range(len(torn) // SECTOR + 1)) - touched:
        span = slice(sector * SECTOR, (sector + 1) * SECTOR)
        old = durable[span] + bytes(SECTOR)  # past the synced end, a hole reads as zeros
        assert torn[span] == old[: len(torn[span])]


def strace_line(call: Call) -> str:
    """`call` as `strace -y -xx` prints it."""
    path = "".join(f"\\x{b:02x}" for b in call.path.encode())
    data = "".join(f"\\x{b:02x}" for b in call.data)
    return f'pwrite64(5<{path}>, "{data}", {len(call.data)}, {call.offset}) = {len(call.data)}'


@given(st.lists(writes, max_size=8))
def test_a_recording_parses_back_into_its_calls(history: list[Call]) -> None:
    log = "\n".join([*map(strace_line, history), "--- SIGCHLD {si_signo=SIGCHLD} ---"])
    assert parse(log, "/data/replica.db") == history
    assert parse(log, "/elsewhere/") == []


def test_a_cut_sees_only_what_was_printed_before_it() -> None:
    history = [
        Call("pwrite64", PATH, b"commit", offset=0),
        Call("sync", PATH),
        Call("stdout", "pipe:[1]", b"ack 0\n"),
        Call("pwrite64", PATH, b"next", offset=6),
    ]
    cuts = list(replay(history, Mode.DROP))
    assert [cut.printed for cut in cuts] == [(), (), (), ("ack 0",)]
    assert cuts[-1].files == {PATH: b"commit"}
