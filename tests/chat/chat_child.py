"""The child process of test_jobs' kill test: `python tests/chat/chat_child.py PATH KEY_HEX
THREAD` opens the replica, starts compressing the chat, prints `summarizing` from inside
the slow part (no transaction open) and sleeps there until killed."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from chat import ChatStore, Message
from replica import Replica


def summarize_slowly(messages: Sequence[Message]) -> str:
    print("summarizing", flush=True)
    time.sleep(3600)
    return "never"


def main(path: str, key_hex: str, thread: str) -> None:
    with Replica.open(path) as replica:
        replica.unlock_with_key(bytes.fromhex(key_hex))
        ChatStore(replica).compress(thread, summarize_slowly, keep_last=1, ttl_s=1.0)


if __name__ == "__main__":
    main(*sys.argv[1:])
