"""The child processes of the chat store's multi-process tests, on one replica file:
`python tests/chat/chat_child.py MODE PATH KEY_HEX THREAD [ARG]` opens the replica, unlocks
it with the raw key, prints `ready`, then by MODE:

- `compress`: starts compressing the chat and prints `summarizing` from inside the slow part
  (no transaction open), where it sleeps until killed;
- `append N`: waits for `go` on stdin, then appends N messages `WHO-i` (WHO: its pid) and
  prints `done`;
- `turn`: holds a turn of the chat, prints `turning`, and sleeps until killed.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

from chat import ChatStore, Message
from replica import Replica


def summarize_slowly(messages: Sequence[Message]) -> str:
    print("summarizing", flush=True)
    time.sleep(3600)
    return "never"


def main(mode: str, path: str, key_hex: str, thread: str, *args: str) -> None:
    with Replica.open(path) as replica:
        replica.unlock_with_key(bytes.fromhex(key_hex))
        store = ChatStore(replica)
        print("ready", flush=True)
        if mode == "compress":
            store.compress(thread, summarize_slowly, keep_last=1, ttl_s=1.0)
        elif mode == "append":
            sys.stdin.readline()
            for i in range(int(args[0])):
                store.append(thread, "user", f"{os.getpid()}-{i}")
            print("done", flush=True)
        elif mode == "turn":
            with store.turn(thread, ttl_s=1.0):
                print("turning", flush=True)
                time.sleep(3600)


if __name__ == "__main__":
    main(*sys.argv[1:])
