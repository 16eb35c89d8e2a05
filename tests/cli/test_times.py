"""Times on the command line: ISO-8601 <-> UTC nanoseconds, exactly."""

from __future__ import annotations

import pytest

from eventlog.cli.times import format_ns, parse_time


@pytest.mark.parametrize(
    "ns", [0, 1, 1_795_960_227_388_609_508, 1_795_960_227_000_000_000, 4_102_444_800_999_999_999]
)
def test_iso_times_round_trip_to_the_nanosecond(ns: int) -> None:
    assert parse_time(format_ns(ns)) == ns


def test_iso_times_without_a_zone_are_utc_and_offsets_are_honoured() -> None:
    assert parse_time("1970-01-02") == 86_400 * 10**9
    assert parse_time("1970-01-01T01:00:00+01:00") == 0
    assert parse_time("1970-01-01T00:00:00.5") == 500_000_000


def test_formatted_times_are_exact_across_many_seconds_and_fractions() -> None:
    """format_ns keeps the seconds it formatted (bounded): every text is still exact."""
    from datetime import UTC, datetime

    start = 1_795_960_227
    for k in range(9_000):  # past the kept seconds' bound, so it is cleared and refilled
        seconds, fraction = start + k + (k // 500) * 86_400, (k * 7_919) % 10**9
        expected = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        assert format_ns(seconds * 10**9 + fraction) == f"{expected}.{fraction:09d}Z"


def test_the_seconds_format_ns_keeps_stay_bounded() -> None:
    """An export of a long log formats a new second every few records: the kept texts do not
    grow with it."""
    from eventlog.cli import times

    for seconds in range(1_795_960_227, 1_795_960_227 + 10_000):
        format_ns(seconds * 10**9)
    assert 0 < len(times._iso_seconds) <= 4096


@pytest.mark.parametrize("text", ["2026-01-01T00:00:00.\u0663", "2026-01-01T00:00:00,\u0663Z"])
def test_a_fraction_in_other_digits_is_not_a_time(text: str) -> None:
    """The fraction's digits were read with int(), which took '٣' as 3 (0.3 s)."""
    with pytest.raises(ValueError, match="is not an ISO-8601 time"):
        parse_time(text)
