"""The data plane as the log sees it: rows of tensors under (partition, staging key).

The log never stores token rows itself; it stores staging keys and trusts nothing about
the data plane that it has not checked. A row's identity is (partition, key) and nothing
else: TransferQueue's internal global index is reused after clears and must never leak out.

A row is a mapping of field name -> ``torch.Tensor`` (any shape, dtype and length; a 0-d
tensor for a scalar such as a reward). Every implementation returns one tensor per row and
field, equal in dtype, shape and values to what was put. Tags are small ``str -> str`` labels
listed with the keys; tag names starting with ``eventlog.`` are reserved for the adapters.

This module stays free of torch so that the ledger and projections can name the protocol
without importing a tensor library.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

import msgspec

# A row is a mapping of field name -> torch.Tensor. Typed as object here so that this module
# does not import torch; the implementations check every value.
Row = Mapping[str, object]

RESERVED_TAG_PREFIX = "eventlog."
"""Tag names with this prefix belong to the adapters; callers may not set them."""


class DataPlaneCheckpoint(msgspec.Struct, frozen=True, kw_only=True):
    """Where a data-plane checkpoint lives, and what it holds (for the ledger digest)."""

    ref: str
    """Absolute directory that `load_checkpoint` reads; survives the process that wrote it."""
    inventory_digest: str
    """sha256 over the sorted (partition, key) pairs saved; recorded in CheckpointCommitted."""
    row_count: int


def inventory_digest(pairs: Iterable[tuple[str, str]]) -> str:
    """sha256 hex digest of a set of (partition, key) pairs, independent of their order.

    Each pair is written as ``len:partition len:key`` so that no choice of names can make two
    different inventories hash alike.
    """
    h = hashlib.sha256()
    for partition, key in sorted(set(pairs)):
        for part in (partition, key):
            raw = part.encode("utf-8")
            h.update(str(len(raw)).encode("ascii") + b":" + raw)
        h.update(b"\n")
    return h.hexdigest()


@runtime_checkable
class DataPlane(Protocol):
    """What every data plane offers; one contract suite runs against each implementation."""

    def list_partitions(self) -> list[str]:
        """Partitions that currently hold at least one row, sorted."""
        ...

    def list_keys(self, partition: str) -> dict[str, dict[str, str]]:
        """Every staging key in the partition with its tags (empty dict when none)."""
        ...

    def put_rows(
        self,
        partition: str,
        rows: Mapping[str, Row],
        tags: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        """Upsert rows by key; returns only after the data plane acknowledged every row.

        An upsert replaces the whole row: fields and tags the new row lacks are gone.
        """
        ...

    def read_rows(self, partition: str, keys: Sequence[str]) -> dict[str, Row]:
        """Rows for exactly these keys; raises MissingRowsError naming any key not present.

        Never returns part of what was asked for.
        """
        ...

    def delete_rows(self, partition: str, keys: Iterable[str]) -> None:
        """Remove rows by key; keys already absent are ignored (idempotent)."""
        ...

    def save_checkpoint(self, directory: str) -> DataPlaneCheckpoint:
        """Persist every partition's rows under `directory` (created if missing)."""
        ...

    def load_checkpoint(self, checkpoint: DataPlaneCheckpoint) -> None:
        """Replace the current contents with the checkpoint's rows.

        Raises DataPlaneError when the loaded inventory does not match the checkpoint's digest.
        """
        ...
