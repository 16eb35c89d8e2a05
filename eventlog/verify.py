"""Tamper evidence: recompute the chain, find gaps and duplicates, name the first bad seq."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import msgspec

from eventlog import chain
from eventlog.records import Record


class Problem(msgspec.Struct, frozen=True):
    """One thing verify found wrong, at the seq where it shows."""

    seq: int
    kind: str  # "gap" | "chain" | "duplicate" | "version"
    message: str


class VerifyReport(msgspec.Struct, frozen=True):
    records: int
    head: int
    last_chain: str
    problems: list[Problem]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def first_bad_seq(self) -> int | None:
        return min((p.seq for p in self.problems), default=None)


def verify_records(
    records: Iterable[Record], duplicate_ids: Iterable[tuple[bytes, int]] = ()
) -> VerifyReport:
    """Walk every record once; stops collecting after the first chain break (all later differ)."""
    problems: list[Problem] = []
    expected_seq = 1
    previous = chain.GENESIS
    versions: dict[str, int] = {}
    count = 0
    head = 0
    chain_broken = False
    for record in records:
        count += 1
        head = record.seq
        if record.seq != expected_seq:
            if record.seq > expected_seq:
                missing = (
                    f"seq {expected_seq}"
                    if record.seq == expected_seq + 1
                    else f"seqs {expected_seq}..{record.seq - 1}"
                )
                problems.append(Problem(expected_seq, "gap", f"{missing} missing"))
            else:
                problems.append(Problem(record.seq, "duplicate", f"seq {record.seq} repeated"))
        expected_seq = record.seq + 1
        last_version = versions.get(record.stream)
        want_version = 0 if last_version is None else last_version + 1
        if record.version != want_version:
            problems.append(
                Problem(
                    record.seq,
                    "version",
                    f"seq {record.seq}: stream {record.stream!r} version {record.version}, "
                    f"expected {want_version}",
                )
            )
        versions[record.stream] = record.version
        link = chain.link(
            previous,
            record.seq,
            record.stream,
            record.version,
            record.event_id.bytes,
            record.type,
            record.schema,
            record.recorded_at,
            record.payload,
        )
        if link != record.chain and not chain_broken:
            chain_broken = True
            problems.append(
                Problem(
                    record.seq,
                    "chain",
                    f"seq {record.seq}: chain mismatch (record edited, removed or reordered)",
                )
            )
        # Continue from the stored value so a single edit is reported once, not at every seq.
        previous = record.chain
    for event_id, seq in duplicate_ids:
        problems.append(
            Problem(seq, "duplicate", f"event id {uuid.UUID(bytes=event_id)} stored more than once")
        )
    problems.sort(key=lambda p: p.seq)
    return VerifyReport(records=count, head=head, last_chain=previous.hex(), problems=problems)
