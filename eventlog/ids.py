"""Time-ordered event ids (UUIDv7 layout), so the unique event_id index grows at its end."""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def new_event_id() -> uuid.UUID:
    """A UUIDv7: 48-bit ms timestamp, 12-bit monotonic counter within the ms, 62 random bits."""
    global _last_ms, _counter
    with _lock:
        now = time.time_ns() // 1_000_000
        if now <= _last_ms:
            _counter += 1
            if _counter > 0xFFF:  # counter exhausted: borrow the next millisecond
                _last_ms += 1
                _counter = 0
            now = _last_ms
        else:
            _last_ms = now
            _counter = 0
        counter = _counter
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (now & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand
    return uuid.UUID(int=value)
