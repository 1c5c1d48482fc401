"""How a sync's progress is shown: JSON lines a program can parse, bars on a terminal only."""

from __future__ import annotations

import io
import json

from rich.console import Console

from clients.cli.progress import default_mode, progress_to_json, shown_progress
from clients.sync import Progress

STEPS = [
    Progress("push_sending", 2, 0, 3, 0, 0, None),
    Progress("receipts_saved", 2, 2, 3, 0, 0, None),
    Progress("merge_start", 3, 3, 3, 0, 0, 7),
    Progress("merged", 3, 3, 3, 3, 7, 7),
]


def terminal() -> tuple[Console, io.StringIO]:
    written = io.StringIO()
    return Console(file=written, force_terminal=True, width=100), written


def test_a_json_line_holds_every_field_and_parses_back() -> None:
    line = progress_to_json(STEPS[2])
    assert "\n" not in line
    assert Progress(**json.loads(line)) == STEPS[2]


def test_bars_show_pushed_of_total_and_the_pull_up_to_the_head() -> None:
    console, written = terminal()
    with shown_progress("bar", console) as on_progress:
        assert on_progress is not None
        for step in STEPS:
            on_progress(step)
    shown = written.getvalue()  # the last state is drawn before the bars are cleared
    assert "3/3" in shown and "7/7" in shown and "3 pulled" in shown


def test_bars_only_where_a_terminal_is_and_none_prints_nothing() -> None:
    console, written = terminal()
    assert default_mode(console) == "bar"
    assert default_mode(Console(file=io.StringIO())) == "none"
    with shown_progress("none", console) as on_progress:
        assert on_progress is None
    assert written.getvalue() == ""
