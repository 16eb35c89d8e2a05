"""Time-ordered event ids (UUIDv7 layout), so the unique event_id index grows at its end.

Minting one is on the path of every append, so it avoids what cost most: one `urandom`
system call per id (random bytes are drawn 4 KiB at a time and forgotten in a forked
child, which must not repeat its parent's ids) and `uuid.UUID`'s argument parsing.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0

_RANDOM_CHUNK = 4096
_random = b""
_offset = 0
_RAND_MASK = (1 << 62) - 1
_TIME_MASK = (1 << 48) - 1
_LAYOUT = 0x7 << 76 | 0b10 << 62
"""The version (7) and variant (RFC 4122) bits every id carries."""
_FEW = 8
"""Up to this many ids (one append's events, a finalize's two) are minted one by one under
one lock: the bulk path's format string and comprehensions cost more than they save."""


def _forget_random() -> None:
    """In a forked child: the parent's unused random bytes would repeat its ids, and a
    parent thread minting at the fork left the lock held for good."""
    global _random, _offset, _lock
    _random, _offset, _lock = b"", 0, threading.Lock()


os.register_at_fork(after_in_child=_forget_random)

_new = object.__new__
_set = object.__setattr__
_UUID = uuid.UUID
_UNKNOWN = uuid.SafeUUID.unknown
_set_int = _UUID.__dict__["int"].__set__  # the slots' own setters: no lookup by name
_set_safe = _UUID.__dict__["is_safe"].__set__
_unpack_from = struct.unpack_from
_from_bytes = int.from_bytes


def new_event_id() -> uuid.UUID:
    """A UUIDv7: 48-bit ms timestamp, 12-bit monotonic counter within the ms, 62 random bits."""
    return new_event_ids(1)[0]


def new_event_ids(count: int) -> list[uuid.UUID]:
    """`count` consecutive UUIDv7s (the writer mints a request's ids under one lock)."""
    return mint_event_ids(count)[0]


def mint_event_ids(count: int) -> tuple[list[uuid.UUID], list[bytes]]:
    """`count` consecutive UUIDv7s, and each one's 16 bytes (what a row stores).

    A few (up to `_FEW`) are minted one by one under one lock. More are drawn in one go:
    the random bits of all of them with one `struct` call, the (ms, counter) pairs in runs
    of one millisecond; each id costs a comprehension step.
    """
    global _last_ms, _counter, _random, _offset
    if count <= 0:
        return [], []
    values: list[int] = []
    with _lock:
        if count <= _FEW:  # an append's few events: no format string, no comprehension
            if _offset + 8 * count > len(_random):
                _random, _offset = os.urandom(_RANDOM_CHUNK), 0
            now = time.time_ns() // 1_000_000
            for _ in range(count):  # each id exactly as `count` single mints would make it
                if now > _last_ms:
                    _last_ms, _counter = now, 0
                elif _counter < 0xFFF:
                    _counter += 1
                else:  # counter exhausted: borrow the next millisecond
                    _last_ms, _counter = _last_ms + 1, 0
                rand = _from_bytes(_random[_offset : _offset + 8], "big")
                _offset += 8
                values.append(
                    (_last_ms & _TIME_MASK) << 80 | _LAYOUT | _counter << 64 | rand & _RAND_MASK
                )
        else:
            need = 8 * count
            if _offset + need > len(_random):
                _random, _offset = os.urandom(max(_RANDOM_CHUNK, need)), 0
            rands = _unpack_from(f">{count}Q", _random, _offset)
            _offset += need
            now = time.time_ns() // 1_000_000
            if now > _last_ms:
                ms, counter = now, 0
            else:  # the same (or an earlier) millisecond: go on counting within the last one
                ms, counter = _last_ms, _counter + 1
            taken = 0
            while taken < count:
                if counter > 0xFFF:  # counter exhausted: borrow the next millisecond
                    ms += 1
                    counter = 0
                run = min(count - taken, 0x1000 - counter)
                base = (ms & _TIME_MASK) << 80 | _LAYOUT
                values += [
                    base | (counter + step) << 64 | rand & _RAND_MASK
                    for step, rand in enumerate(rands[taken : taken + run])
                ]
                taken += run
                counter += run
            _last_ms, _counter = ms, counter - 1
    # What uuid.UUID(int=value) stores, without re-checking a value built in range.
    minted: list[uuid.UUID] = []
    raw: list[bytes] = []
    for value in values:
        minted_id: uuid.UUID = _new(_UUID)
        _set_int(minted_id, value)
        _set_safe(minted_id, _UNKNOWN)
        minted.append(minted_id)
        raw.append(value.to_bytes(16, "big"))
    return minted, raw


def uuid_from_bytes(value: bytes) -> uuid.UUID:
    """`uuid.UUID(bytes=value)` for 16 bytes already checked, without its argument parsing
    (a read builds one per record)."""
    event_id: uuid.UUID = _new(_UUID)
    _set(event_id, "int", int.from_bytes(value, "big"))
    _set(event_id, "is_safe", _UNKNOWN)
    return event_id
