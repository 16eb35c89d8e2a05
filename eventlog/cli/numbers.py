"""Whole numbers on the command line and in stored text: ASCII digits only.

`int()` reads '٣' as 3, '1_000' as 1000 and ' 7 ' as 7, so `diff RUN ٣ head` compared seq 3.
Whoever wrote one of those meant something else, or nothing a number names.
"""

from __future__ import annotations

import re
from typing import Any

import click

_WHOLE = re.compile(r"-?[0-9]{1,40}")


def whole_number(text: str) -> int | None:
    """`text` as an int if it is one written in ASCII digits (with an optional '-'), else
    None. Forty digits at most: no seq, step or count is longer, and int() of a million
    digits takes seconds."""
    return int(text) if _WHOLE.fullmatch(text) else None


class Number(click.IntRange):
    """click's IntRange, for ASCII digits only."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and whole_number(value) is None:
            self.fail(f"{value!r} is not a whole number written in ASCII digits", param, ctx)
        return super().convert(value, param, ctx)
