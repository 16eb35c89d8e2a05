"""Times on the command line and in output: UTC nanoseconds <-> ISO-8601."""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime, timedelta

import click

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_FRACTION = re.compile(
    r"^(?P<head>.*?T\d{2}:\d{2}(?::\d{2})?)[.,](?P<frac>\d+)(?P<tail>.*)$", re.ASCII
)


@functools.lru_cache(maxsize=1024)
def _stamp(seconds: int, separator: str) -> str:
    """One second's date and time (cached: a log's records come many to a second, and
    strftime was the largest cost of `replay --json`)."""
    return (_EPOCH + timedelta(seconds=seconds)).strftime(f"%Y-%m-%d{separator}%H:%M:%S")


def format_ns(ns: int) -> str:
    """UTC ns as ISO-8601 with nine fractional digits: 2026-11-29T12:00:00.123456789Z."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    stamp = _iso_seconds.get(seconds)
    if stamp is None:
        if len(_iso_seconds) >= 4096:
            _iso_seconds.clear()
        stamp = _iso_seconds[seconds] = _stamp(seconds, "T")
    return f"{stamp}.{str(fraction).zfill(9)}Z"  # half the time of a :09d format spec


_iso_seconds: dict[int, str] = {}
"""format_ns's seconds already written (a dict lookup: the lru_cache's call and argument
tuple cost more); bounded, cleared when full."""


def short_time(ns: int) -> str:
    """UTC time to the millisecond, for tables."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    return f"{_stamp(seconds, ' ')}.{fraction // 1_000_000:03d}"


def parse_time(text: str) -> int:
    """ISO-8601 (date, or date and time; no zone means UTC) as UTC nanoseconds, exactly."""
    fraction_ns = 0
    base = text.strip()
    match = _FRACTION.match(base)
    if match:
        digits = match["frac"]
        fraction_ns = int(digits[:9].ljust(9, "0"))
        base = match["head"] + match["tail"]
    try:
        moment = datetime.fromisoformat(base)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not an ISO-8601 time") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + fraction_ns


def time_option(_ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """click callback: an ISO-8601 option value as UTC nanoseconds."""
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param=param) from exc
