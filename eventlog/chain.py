"""The hash chain: each record's chain value covers every record before it.

chain(n) = sha256(chain(n-1) || canonical(record n)), chain(0) = 32 zero bytes, where the
canonical bytes are the msgpack array [seq, stream, version, event_id (16 bytes), type,
schema, recorded_at, payload]. Editing, deleting or reordering any record changes every
chain value from there on; truncating the newest records needs an anchor kept elsewhere.
"""

from __future__ import annotations

import hashlib

import msgspec

GENESIS = bytes(32)
_encode = msgspec.msgpack.Encoder().encode


def link(
    previous: bytes,
    seq: int,
    stream: str,
    version: int,
    event_id: bytes,
    type_name: str,
    schema: int,
    recorded_at: int,
    payload: bytes,
) -> bytes:
    """The chain value of one record given the chain value of the record before it."""
    canonical = _encode((seq, stream, version, event_id, type_name, schema, recorded_at, payload))
    return hashlib.sha256(previous + canonical).digest()


Fields = tuple[int, str, int, bytes, str, int, int, bytes]
"""A record's canonical fields in chain order: seq, stream, version, event_id, type, schema,
recorded_at, payload (the columns of an events row before its chain value)."""


def link_fields(previous: bytes, fields: Fields) -> bytes:
    """`link` for fields already gathered in chain order (the writer's hot loop)."""
    return _sha256(previous + _encode(fields)).digest()


Row = tuple[int, str, int, bytes, str, int, int, bytes, bytes]
"""A record's fields followed by its chain value: an events row in column order."""


def link_rows(previous: bytes, fields: list[Fields], rows: list[Row]) -> bytes:
    """Append each record's row (its fields, then its chain value) to `rows`, each linked to
    the one before, starting from `previous`; return the last chain value (the writer's
    hot loop: one call per request, not one per event)."""
    encode, sha256, append = _encode, _sha256, rows.append
    for record in fields:
        previous = sha256(previous + encode(record)).digest()
        append((*record, previous))
    return previous


_sha256 = hashlib.sha256
