"""Minted event ids: UUIDv7 layout, ordered in one process, distinct across a fork."""

from __future__ import annotations

import os
import types
import uuid

import pytest

import eventlog.ids
from eventlog.ids import mint_event_ids, new_event_id


def test_minted_ids_are_uuid7_equal_to_their_parsed_form_and_strictly_increasing() -> None:
    ids = [new_event_id() for _ in range(5000)]
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert all(uuid.UUID(bytes=i.bytes) == i and hash(uuid.UUID(str(i))) == hash(i) for i in ids)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_mints_ids_its_parent_does_not() -> None:
    new_event_id()  # the parent now holds unused random bytes a child would inherit
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        os.write(write, b"".join(new_event_id().bytes for _ in range(64)))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    child = {data[i : i + 16][8:] for i in range(0, len(data), 16)}
    parent = {new_event_id().bytes[8:] for _ in range(64)}
    # The random tails (bytes 8..15) of the two processes' ids never meet.
    assert len(child) == 64 and not child & parent


def test_ids_minted_in_one_go_are_uuid7_increasing_and_carry_their_own_bytes() -> None:
    """A writer mints a whole submission's ids at once, past the 4096 a millisecond's counter
    holds: each id still follows the one before (and the single ids minted around them), and
    the bytes beside it are its own (they are what the row stores)."""
    before = new_event_id()
    ids, raw = mint_event_ids(10_000)
    after = new_event_id()
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert [i.bytes for i in ids] == raw
    assert all(uuid.UUID(bytes=b) == i for b, i in zip(raw, ids, strict=True))
    minted = [before, *ids, after]
    assert minted == sorted(minted) and len(set(minted)) == len(minted)
    assert mint_event_ids(0) == ([], [])


def test_a_frozen_clock_still_mints_increasing_ids_one_by_one_and_in_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More than 4096 ids within one millisecond (the counter's room) borrow the next
    millisecond, whether minted one per append or a submission at a time."""
    frozen = types.SimpleNamespace(time_ns=lambda: 1_900_000_000_000_000_000)
    monkeypatch.setattr(eventlog.ids, "time", frozen)
    singles = [new_event_id() for _ in range(5000)]
    batch, raw = mint_event_ids(5000)
    more = [new_event_id() for _ in range(10)]
    minted = [*singles, *batch, *more]
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in minted)
    assert minted == sorted(minted) and len(set(minted)) == len(minted)
    assert [i.bytes for i in batch] == raw
    assert all(uuid.UUID(bytes=i.bytes) == i for i in singles)


def test_a_few_ids_minted_together_are_the_ids_as_many_single_mints_would_make(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An append of a few events (a finalize's two) mints them one by one under one lock:
    in a frozen millisecond each counts on from the one before and borrows the next
    millisecond past 4096, exactly like single mints, and no bulk draw is made for them."""
    frozen = types.SimpleNamespace(time_ns=lambda: 1_950_000_000_000_000_000)
    monkeypatch.setattr(eventlog.ids, "time", frozen)

    def no_bulk_draw(*args: object) -> tuple[int, ...]:
        raise AssertionError("a few ids took the bulk path")

    monkeypatch.setattr(eventlog.ids, "_unpack_from", no_bulk_draw)
    singles = [new_event_id() for _ in range(4090)]
    few: list[uuid.UUID] = []
    raw: list[bytes] = []
    for _ in range(4):  # 4090 + 12 ids: the counter runs out inside the third call
        ids, got = mint_event_ids(3)
        few += ids
        raw += got
    minted = [*singles, *few, new_event_id()]
    assert minted == sorted(minted) and len(set(minted)) == len(minted)
    assert len(few) == 12 and [i.bytes for i in few] == raw
    # (ms, counter) of each id: the same sequence single mints produce
    stamps = [(i.int >> 80, (i.int >> 64) & 0xFFF) for i in minted]
    ms0 = stamps[0][0]
    expected = [(ms0 + n // 4096, n % 4096) for n in range(len(minted))]
    assert stamps == expected


@pytest.mark.parametrize(
    ("last_ms", "counter"),
    [(0, 0), (1_960_000_000_000, 7), (1_960_000_000_000, 0xFFD)],
    ids=["a new millisecond", "counting on", "borrowing the next millisecond"],
)
def test_the_few_path_and_the_bulk_path_mint_the_same_ids_from_the_same_state(
    monkeypatch: pytest.MonkeyPatch, last_ms: int, counter: int
) -> None:
    """One rule, two ways of applying it: from the same clock, counter and random bytes, the
    few path and the bulk path give the same ids, bit for bit (the random tail included),
    and leave the same counter behind."""
    frozen = types.SimpleNamespace(time_ns=lambda: 1_960_000_000_000 * 1_000_000)
    monkeypatch.setattr(eventlog.ids, "time", frozen)
    random = os.urandom(eventlog.ids._RANDOM_CHUNK)
    count = eventlog.ids._FEW
    minted = []
    for few in (count, 0):  # the few path, then the bulk path for the same count
        monkeypatch.setattr(eventlog.ids, "_FEW", few)
        monkeypatch.setattr(eventlog.ids, "_last_ms", last_ms)
        monkeypatch.setattr(eventlog.ids, "_counter", counter)
        monkeypatch.setattr(eventlog.ids, "_random", random)
        monkeypatch.setattr(eventlog.ids, "_offset", 0)
        ids, raw = mint_event_ids(count)
        assert [i.bytes for i in ids] == raw
        minted.append((raw, eventlog.ids._last_ms, eventlog.ids._counter, eventlog.ids._offset))
    assert minted[0] == minted[1]
