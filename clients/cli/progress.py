"""A sync's progress for the person or the program watching: a bar, or one JSON line a step.

`bar` (the default on a terminal) draws rich bars on stderr: versions pushed of those waiting,
and the pull as sequence numbers covered up to the relay's head. `json` writes each
`clients.sync.Progress` as one JSON object a line on stderr, flushed as it happens, so a GUI or
a script can follow the phases (and a test can tell which phase a killed run was in); the
`error:` and `hint:` lines of a failure are not JSON, so a reader skips lines that are not.
`none` prints nothing. Progress events hold counts only, never a record, key or token.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal, get_args

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
from rich.progress import Progress as ProgressBars

from clients.sync import Phase, Progress

ProgressMode = Literal["bar", "json", "none"]
PROGRESS_MODES: tuple[ProgressMode, ...] = get_args(ProgressMode)
OnProgress = Callable[[Progress], None]
PUSH_PHASES: frozenset[Phase] = frozenset({"push_sending", "push_answered", "receipts_saved"})
DOING_BY_PHASE: dict[Phase, str] = {
    "push_sending": "sending",
    "push_answered": "saving receipts",
    "receipts_saved": "",
    "pull_sending": "fetching",
    "merge_start": "merging",
    "merged": "",
}


def default_mode(console: Console) -> ProgressMode:
    """Bars where someone watches a terminal; nothing in a pipe, a log or a cron mail."""
    return "bar" if console.is_terminal else "none"


def progress_to_json(progress: Progress) -> str:
    return json.dumps(dataclasses.asdict(progress), separators=(",", ":"))


def print_json(progress: Progress) -> None:
    click.echo(progress_to_json(progress), err=True)  # click.echo flushes: the line is out now


@contextmanager
def shown_progress(mode: ProgressMode, console: Console) -> Iterator[OnProgress | None]:
    """The callback for `SyncDriver(progress=…)` that shows progress as `mode` says; bars are
    removed when the block ends, leaving the summary line to the caller."""
    if mode == "json":
        yield print_json
    elif mode == "bar":
        with bars(console) as on_progress:
            yield on_progress
    else:
        yield None


@contextmanager
def bars(console: Console) -> Iterator[OnProgress]:
    columns = (TextColumn("{task.description:<6}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[note]}"))  # fmt: skip
    with ProgressBars(*columns, console=console, transient=True) as shown:
        push = shown.add_task("push", total=None, note="")
        pull = shown.add_task("pull", total=None, note="")

        def on_progress(p: Progress) -> None:
            doing = DOING_BY_PHASE[p.phase]
            pushing = p.phase in PUSH_PHASES
            shown.update(
                push, completed=p.pushed, total=p.push_total, note=doing if pushing else ""
            )
            note = f"{p.pulled} pulled" + ("" if pushing or not doing else f", {doing}")
            shown.update(pull, completed=p.pull_done, total=p.pull_total, note=note)

        yield on_progress
