"""The projection version: which code folded a ledger state (snapshots and digests carry it).

A snapshot or a ledger digest is only comparable with a state folded by the same projection:
add a field to `LedgerState` (or anything it holds) and the same log folds to other bytes.
The version is derived from the state's shape (msgspec's JSON schema, descriptions left out
so a docstring edit changes nothing) plus `SEMANTIC_VERSION`, bumped by hand when a fold rule
changes what a state means without changing its shape.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from projections.siblings import LedgerState

SEMANTIC_VERSION = 1
"""Bump when the fold changes meaning but not shape (e.g. a status reached by other events)."""


def _shape(schema: Any) -> Any:
    """The schema without its prose: descriptions and titles do not change a state's bytes."""
    if isinstance(schema, dict):
        return {k: _shape(v) for k, v in schema.items() if k not in ("description", "title")}
    if isinstance(schema, list):
        return [_shape(v) for v in schema]
    return schema


def projection_version(state_type: type[Any] = LedgerState) -> str:
    """`<semantic>.<12 hex digits of the shape's sha256>` for a state type."""
    shape = msgspec.json.encode(_shape(msgspec.json.schema(state_type)), order="sorted")
    return f"{SEMANTIC_VERSION}.{hashlib.sha256(shape).hexdigest()[:12]}"


PROJECTION_VERSION = projection_version()
"""The version of the code that is running."""
