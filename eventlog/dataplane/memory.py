"""An in-memory data plane with TransferQueue's contract, for fast tests and the demo.

It keeps rows in a dict guarded by a lock and copies tensors on the way in and out, so a
caller can never change stored rows by mutating what it put or read (as with TQ, where rows
cross a process boundary). Checkpoints are files, so a restore in a fresh process works
after the process that saved them was killed.

torch is imported where rows or checkpoint files are handled, not at import: the plane's
module loads without it (rows are tensors, so a caller that has rows has torch already).

A checkpoint is one file of the plane's own format (`memory-dataplane.rows`): a msgpack index
(partition, key, tags, and per field its dtype, shape and byte range) followed by every
tensor's raw bytes. Loading reads the file and the index only; a row's tensors are built
when the row is first read, so a restore that only lists keys and tags never imports torch
or unpickles anything. Checkpoints of the first format (`memory-dataplane.pt`, torch.save of
a dict) still load, through `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from eventlog.dataplane._rows import check_keys, check_partition, check_rows
from eventlog.dataplane.files import fsync_folder, make_folder_durably
from eventlog.dataplane.protocol import DataPlaneCheckpoint, Row, inventory_digest
from eventlog.recovery.errors import DataPlaneError, MissingRowsError

if TYPE_CHECKING:
    import torch

    _Stored = tuple[dict[str, torch.Tensor] | "_Packed", dict[str, str]]

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "memory-dataplane.rows"
LEGACY_CHECKPOINT_FILE = "memory-dataplane.pt"
"""The first format (torch.save of a dict, format 1): still loaded, no longer written."""
_LEGACY_FORMAT = 1
_FORMAT = 2
_MAGIC = b"EVLDP\x00\x02\n"
_Entry = tuple[str, str, list[int], int, int]
"""One field in a checkpoint file: name, dtype name, shape, offset and length of its bytes."""


class _Packed:
    """A row's fields as loaded from a checkpoint file: byte ranges of one shared buffer,
    turned into tensors when the row is read."""

    __slots__ = ("data", "entries")

    def __init__(self, data: bytearray, entries: list[_Entry]) -> None:
        self.data = data
        self.entries = entries

    def tensors(self) -> dict[str, torch.Tensor]:
        import torch

        fields: dict[str, torch.Tensor] = {}
        for name, dtype, shape, offset, size in self.entries:
            kind = getattr(torch, dtype)
            if not size:  # frombuffer refuses an empty range
                fields[name] = torch.empty(shape, dtype=kind)
                continue
            flat = torch.frombuffer(self.data, dtype=torch.uint8, count=size, offset=offset)
            fields[name] = flat.view(kind).reshape(shape).clone()
        return fields


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
        return {
            key: fields.tensors() if isinstance(fields, _Packed) else _clone(fields)
            for key, fields in found.items()
        }

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
        """Write every row to ``directory/memory-dataplane.rows`` atomically and durably."""
        target = Path(directory).resolve()
        make_folder_durably(target)
        with self._lock:
            # Serialised while we hold the lock, so the file is one consistent cut.
            index, chunks = _pack_rows(self._partitions)
            pairs = [(p, k) for p, rows in self._partitions.items() for k in rows]
        _write_atomically(target / CHECKPOINT_FILE, index, chunks)
        checkpoint = DataPlaneCheckpoint(
            ref=str(target), inventory_digest=inventory_digest(pairs), row_count=len(pairs)
        )
        logger.info("saved in-memory data plane: %d rows to %s", len(pairs), target)
        return checkpoint

    def load_checkpoint(self, checkpoint: DataPlaneCheckpoint) -> None:
        """Replace every row with the checkpoint's, after checking its inventory digest."""
        directory = Path(checkpoint.ref)
        path = directory / CHECKPOINT_FILE
        if path.is_file():
            partitions = _read_rows_file(path)
        elif (directory / LEGACY_CHECKPOINT_FILE).is_file():
            partitions = _read_legacy_file(directory / LEGACY_CHECKPOINT_FILE)
        else:
            raise DataPlaneError(
                f"data-plane checkpoint {checkpoint.ref!r}: expected file {CHECKPOINT_FILE}, "
                "found none (not an in-memory data-plane checkpoint?)"
            )
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


def _pack_rows(
    partitions: Mapping[str, Mapping[str, _Stored]],
) -> tuple[dict[str, object], list[bytes | memoryview]]:
    """The checkpoint's index and its data chunks, in file order."""
    chunks: list[bytes | memoryview] = []
    offset = 0
    index: dict[str, list[object]] = {}
    for partition, rows in partitions.items():
        if not rows:
            continue
        listed: list[object] = []
        for key, (fields, tags) in rows.items():
            entries: list[_Entry] = []
            if isinstance(fields, _Packed):
                for name, dtype, shape, start, size in fields.entries:
                    chunks.append(memoryview(fields.data)[start : start + size])
                    entries.append((name, dtype, shape, offset, size))
                    offset += size
            else:
                for name, tensor in fields.items():
                    raw = tensor.contiguous().reshape(-1).view(_uint8()).numpy().tobytes()
                    dtype = str(tensor.dtype).removeprefix("torch.")
                    entries.append((name, dtype, list(tensor.shape), offset, len(raw)))
                    chunks.append(raw)
                    offset += len(raw)
            listed.append((key, tags, entries))
        index[partition] = listed
    return {"format": _FORMAT, "byte_order": sys.byteorder, "partitions": index}, chunks


def _uint8() -> torch.dtype:
    import torch

    return torch.uint8


def _read_rows_file(path: Path) -> dict[str, dict[str, _Stored]]:
    """The rows of a checkpoint file (format 2); tensors stay bytes until read."""
    try:
        blob = path.read_bytes()
        if blob[: len(_MAGIC)] != _MAGIC:
            raise ValueError("not an eventlog data-plane file (bad magic)")
        start = len(_MAGIC) + 8
        size = int.from_bytes(blob[len(_MAGIC) : start], "little")
        index = msgspec.msgpack.decode(blob[start : start + size], type=_Index)
        data = bytearray(blob[start + size :])
        if index.format != _FORMAT or index.byte_order != sys.byteorder:
            raise ValueError(f"format {index.format} ({index.byte_order}-endian)")
        end = max(
            (e[3] + e[4] for rows in index.partitions.values() for _, _, es in rows for e in es),
            default=0,
        )
        if end != len(data):
            raise ValueError(f"expected {end} bytes of tensors, found {len(data)}")
    except (OSError, ValueError, msgspec.DecodeError) as exc:
        raise DataPlaneError(f"data-plane checkpoint {str(path)!r} is unreadable: {exc}") from exc
    return {
        partition: {key: (_Packed(data, entries), tags) for key, tags, entries in rows}
        for partition, rows in index.partitions.items()
    }


class _Index(msgspec.Struct, frozen=True):
    format: int
    byte_order: str
    partitions: dict[str, list[tuple[str, dict[str, str], list[_Entry]]]]


def _read_legacy_file(path: Path) -> dict[str, dict[str, _Stored]]:
    """A checkpoint of the first format (torch.save of a dict of tensors)."""
    import torch

    try:
        payload = torch.load(path, weights_only=True)
    except Exception as exc:  # torch raises many types for a corrupt file
        raise DataPlaneError(f"data-plane checkpoint {str(path)!r} is unreadable: {exc}") from exc
    if not isinstance(payload, dict) or payload.get("format") != _LEGACY_FORMAT:
        raise DataPlaneError(
            f"data-plane checkpoint {str(path)!r}: expected format {_LEGACY_FORMAT}, "
            f"found {payload.get('format') if isinstance(payload, dict) else type(payload)}"
        )
    return {
        partition: {key: (entry["fields"], entry["tags"]) for key, entry in rows.items()}
        for partition, rows in payload["partitions"].items()
    }


def _clone(fields: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in fields.items()}


def _write_atomically(path: Path, index: object, chunks: list[bytes | memoryview]) -> None:
    """Write to a temporary file, fsync, rename over `path`, fsync the directory."""
    header = msgspec.msgpack.encode(index)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(_MAGIC + len(header).to_bytes(8, "little") + header)
        for chunk in chunks:
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_folder(path.parent)
