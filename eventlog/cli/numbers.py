"""Whole numbers on the command line and in stored text: ASCII digits only.

`int()` reads '٣' as 3, '1_000' as 1000 and ' 7 ' as 7, so `diff RUN ٣ head` compared seq 3.
Whoever wrote one of those meant something else, or nothing a number names.
"""

from __future__ import annotations

import re
from typing import Any

import click

_WHOLE = re.compile(r"-?[0-9]+")

MAX_DIGITS = 4000
"""Longer is refused: int() of a million digits takes seconds (Python refuses 4,300)."""


def whole_number(text: str) -> int | None:
    """`text` as an int if it is one written in ASCII digits (with an optional '-') and at
    most MAX_DIGITS of them, else None."""
    return int(text) if _WHOLE.fullmatch(text) and len(text.lstrip("-")) <= MAX_DIGITS else None


def _refusal(text: str) -> str:
    if not _WHOLE.fullmatch(text):
        return f"{text!r} is not a whole number written in ASCII digits"
    return f"{text[:20]}... has more than {MAX_DIGITS} digits"


def _require_digits(
    kind: click.types.IntParamType,
    value: Any,
    param: click.Parameter | None,
    ctx: click.Context | None,
) -> None:
    if isinstance(value, str) and whole_number(value) is None:
        kind.fail(_refusal(value), param, ctx)


class _Whole(click.types.IntParamType):
    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        _require_digits(self, value, param, ctx)
        return super().convert(value, param, ctx)


class _WholeInRange(click.IntRange):
    name = "integer"  # the help shows the range beside the default, not `INTEGER RANGE`

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        _require_digits(self, value, param, ctx)
        return super().convert(value, param, ctx)


def number(min: int | None = None, max: int | None = None) -> click.types.IntParamType:
    """click's INT, or its IntRange where a bound is given, for ASCII digits only (an
    unbounded IntRange printed `[x<=None]` in the help)."""
    if min is None and max is None:
        return _Whole()
    return _WholeInRange(min=min, max=max)
