"""An in-memory data plane with TransferQueue's contract, for fast tests and the demo.

It keeps rows in a dict guarded by a lock and copies tensors on the way in and out, so a
caller can never change stored rows by mutating what it put or read (as with TQ, where rows
cross a process boundary). Checkpoints are files, so a restore in a fresh process works
after the process that saved them was killed.

torch is imported where rows or checkpoint files are handled, not at import: the plane's
module loads without it (rows are tensors, so a caller that has rows has torch already).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from eventlog.dataplane._rows import check_keys, check_partition, check_rows
from eventlog.dataplane.protocol import DataPlaneCheckpoint, Row, inventory_digest
from eventlog.recovery.errors import DataPlaneError, MissingRowsError

if TYPE_CHECKING:
    import torch

    _Stored = tuple[dict[str, torch.Tensor], dict[str, str]]

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "memory-dataplane.pt"
_FORMAT = 1


class InMemoryDataPlane:
    """Rows in process memory; same behaviour as `TransferQueueDataPlane`, no Ray needed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._partitions: dict[str, dict[str, _Stored]] = {}

    def list_partitions(self) -> list[str]:
        """Partitions that currently hold at least one row, sorted."""
        with self._lock:
            return sorted(p for p, rows in self._partitions.items() if rows)

    def list_keys(self, partition: str) -> dict[str, dict[str, str]]:
        """Every staging key in the partition with its tags (empty dict when none)."""
        check_partition(partition)
        with self._lock:
            rows = self._partitions.get(partition, {})
            return {key: dict(tags) for key, (_, tags) in rows.items()}

    def put_rows(
        self,
        partition: str,
        rows: Mapping[str, Row],
        tags: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        """Upsert whole rows (fields and tags) by key, all after validating all."""
        checked = check_rows(partition, rows, tags)
        copies = [(row.key, _clone(row.fields), row.tags) for row in checked]
        if not copies:
            return
        with self._lock:
            stored = self._partitions.setdefault(partition, {})
            for key, fields, row_tags in copies:
                stored[key] = (fields, row_tags)

    def read_rows(self, partition: str, keys: Sequence[str]) -> dict[str, Row]:
        """Copies of the rows for exactly these keys, or MissingRowsError and nothing."""
        check_partition(partition)
        wanted = check_keys(partition, keys)
        with self._lock:
            stored = self._partitions.get(partition, {})
            missing = [key for key in wanted if key not in stored]
            if missing:
                raise MissingRowsError(partition, missing)
            found = {key: stored[key][0] for key in wanted}
        return {key: _clone(fields) for key, fields in found.items()}

    def delete_rows(self, partition: str, keys: Iterable[str]) -> None:
        """Remove rows by key; absent keys and unknown partitions are ignored."""
        check_partition(partition)
        doomed = check_keys(partition, keys)
        with self._lock:
            stored = self._partitions.get(partition)
            if stored is None:
                return
            for key in doomed:
                stored.pop(key, None)
            if not stored:
                del self._partitions[partition]

    def clear(self) -> None:
        """Remove every row of every partition."""
        with self._lock:
            self._partitions.clear()

    def save_checkpoint(self, directory: str) -> DataPlaneCheckpoint:
        """Write every row to ``directory/memory-dataplane.pt`` atomically and durably."""
        target = Path(directory).resolve()
        target.mkdir(parents=True, exist_ok=True)
        with self._lock:
            payload = {
                "format": _FORMAT,
                "partitions": {
                    partition: {
                        key: {"fields": fields, "tags": tags}
                        for key, (fields, tags) in rows.items()
                    }
                    for partition, rows in self._partitions.items()
                    if rows
                },
            }
            pairs = [(p, k) for p, rows in self._partitions.items() for k in rows]
            # torch.save serialises while we hold the lock so the file is one consistent cut.
            _write_atomically(target / CHECKPOINT_FILE, payload)
        checkpoint = DataPlaneCheckpoint(
            ref=str(target), inventory_digest=inventory_digest(pairs), row_count=len(pairs)
        )
        logger.info("saved in-memory data plane: %d rows to %s", len(pairs), target)
        return checkpoint

    def load_checkpoint(self, checkpoint: DataPlaneCheckpoint) -> None:
        """Replace every row with the checkpoint's, after checking its inventory digest."""
        path = Path(checkpoint.ref) / CHECKPOINT_FILE
        if not path.is_file():
            raise DataPlaneError(
                f"data-plane checkpoint {checkpoint.ref!r}: expected file {CHECKPOINT_FILE}, "
                "found none (not an in-memory data-plane checkpoint?)"
            )
        import torch

        try:
            payload = torch.load(path, weights_only=True)
        except Exception as exc:  # torch raises many types for a corrupt file
            raise DataPlaneError(
                f"data-plane checkpoint {str(path)!r} is unreadable: {exc}"
            ) from exc
        if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
            raise DataPlaneError(
                f"data-plane checkpoint {str(path)!r}: expected format {_FORMAT}, "
                f"found {payload.get('format') if isinstance(payload, dict) else type(payload)}"
            )
        partitions: dict[str, dict[str, _Stored]] = {
            partition: {key: (entry["fields"], entry["tags"]) for key, entry in rows.items()}
            for partition, rows in payload["partitions"].items()
        }
        pairs = [(p, k) for p, rows in partitions.items() for k in rows]
        found = inventory_digest(pairs)
        if found != checkpoint.inventory_digest:
            raise DataPlaneError(
                f"data-plane checkpoint {checkpoint.ref!r}: expected inventory digest "
                f"{checkpoint.inventory_digest} ({checkpoint.row_count} rows), "
                f"found {found} ({len(pairs)} rows)"
            )
        with self._lock:
            self._partitions = partitions
        logger.info("loaded in-memory data plane: %d rows from %s", len(pairs), checkpoint.ref)


def _clone(fields: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in fields.items()}


def _write_atomically(path: Path, payload: object) -> None:
    """Write to a temporary file, fsync, rename over `path`, fsync the directory."""
    import torch

    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
