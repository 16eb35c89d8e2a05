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
