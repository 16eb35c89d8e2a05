"""Time-ordered event ids (UUIDv7 layout), so the unique event_id index grows at its end.

Minting one is on the path of every append, so it avoids what cost most: one `urandom`
system call per id (random bytes are drawn 4 KiB at a time and forgotten in a forked
child, which must not repeat its parent's ids) and `uuid.UUID`'s argument parsing.
"""

from __future__ import annotations

import os
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


def _forget_random() -> None:
    """In a forked child: the parent's unused random bytes would repeat its ids."""
    global _random, _offset
    _random, _offset = b"", 0


os.register_at_fork(after_in_child=_forget_random)

_new = object.__new__
_set = object.__setattr__
_UUID = uuid.UUID
_UNKNOWN = uuid.SafeUUID.unknown


def new_event_id() -> uuid.UUID:
    """A UUIDv7: 48-bit ms timestamp, 12-bit monotonic counter within the ms, 62 random bits."""
    return new_event_ids(1)[0]


def new_event_ids(count: int) -> list[uuid.UUID]:
    """`count` consecutive UUIDv7s (the writer mints a request's ids under one lock)."""
    global _last_ms, _counter, _random, _offset
    minted: list[uuid.UUID] = []
    with _lock:
        now = time.time_ns() // 1_000_000
        for _ in range(count):
            if now <= _last_ms:
                _counter += 1
                if _counter > 0xFFF:  # counter exhausted: borrow the next millisecond
                    _last_ms += 1
                    _counter = 0
                now = _last_ms
            else:
                _last_ms = now
                _counter = 0
            if _offset >= len(_random):
                _random, _offset = os.urandom(_RANDOM_CHUNK), 0
            rand = int.from_bytes(_random[_offset : _offset + 8], "big") & _RAND_MASK
            _offset += 8
            value = (now & _TIME_MASK) << 80 | 0x7 << 76 | _counter << 64 | 0b10 << 62 | rand
            # What uuid.UUID(int=value) stores, without re-checking a value built in range.
            event_id: uuid.UUID = _new(_UUID)
            _set(event_id, "int", value)
            _set(event_id, "is_safe", _UNKNOWN)
            minted.append(event_id)
    return minted


def uuid_from_bytes(value: bytes) -> uuid.UUID:
    """`uuid.UUID(bytes=value)` for 16 bytes already checked, without its argument parsing
    (a read builds one per record)."""
    event_id: uuid.UUID = _new(_UUID)
    _set(event_id, "int", int.from_bytes(value, "big"))
    _set(event_id, "is_safe", _UNKNOWN)
    return event_id
