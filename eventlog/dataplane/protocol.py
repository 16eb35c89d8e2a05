"""The data plane as the log sees it: rows of tensors under (partition, staging key).

The log never stores token rows itself; it stores staging keys and trusts nothing about
the data plane that it has not checked. A row's identity is (partition, key) and nothing
else: TransferQueue's internal global index is reused after clears and must never leak out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

import msgspec

# A row is a mapping of field name -> value. Values are torch tensors for token data; the
# in-memory twin accepts any value, the TransferQueue adapter requires tensors or scalars.
Row = Mapping[str, object]


class DataPlaneCheckpoint(msgspec.Struct, frozen=True, kw_only=True):
    """Where a data-plane checkpoint lives, and what it holds (for the ledger digest)."""

    ref: str
    """Opaque location (a directory for TQ, a token for the twin) that `load_checkpoint` takes."""
    inventory_digest: str
    """sha256 over the sorted (partition, key) pairs saved; recorded in CheckpointCommitted."""
    row_count: int


@runtime_checkable
class DataPlane(Protocol):
    """What every data plane offers; one contract suite runs against each implementation."""

    def list_partitions(self) -> list[str]:
        """Partitions that currently hold at least one row."""
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
        """Upsert rows by key; returns only after the data plane acknowledged every row."""
        ...

    def read_rows(self, partition: str, keys: Sequence[str]) -> dict[str, Row]:
        """Rows for exactly these keys; raises MissingRowsError naming any key not present."""
        ...

    def delete_rows(self, partition: str, keys: Iterable[str]) -> None:
        """Remove rows by key; keys already absent are ignored (idempotent)."""
        ...

    def save_checkpoint(self, directory: str) -> DataPlaneCheckpoint:
        """Persist every partition's rows under `directory`."""
        ...

    def load_checkpoint(self, checkpoint: DataPlaneCheckpoint) -> None:
        """Replace the current contents with the checkpoint's rows."""
        ...
