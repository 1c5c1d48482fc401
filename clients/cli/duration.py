"""Durations on the command line: `90`, `30s`, `5m`, `1h`, `1d`, `0.5s` (seconds unless
a unit says otherwise)."""

from __future__ import annotations

import math
import re

import click

UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*")


class Duration(click.ParamType[float, "str | float"]):
    name = "duration"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        match = _DURATION.fullmatch(str(value))
        seconds = float(match[1]) * UNIT_SECONDS[match[2]] if match else math.nan
        if not (math.isfinite(seconds) and seconds > 0):
            self.fail(f"{value!r} is not a duration such as 30s, 5m, 1h or 1d", param, ctx)
        return seconds


DURATION = Duration()
