"""The data plane on TransferQueue (TQ 0.1.11, SimpleStorage backend on a local Ray).

The only module that imports ``ray`` and ``transfer_queue``. What it papers over, so that it
behaves exactly like `InMemoryDataPlane` (one contract suite runs against both):

- TQ answers a read with whatever subset of the keys it has, and its key lookup answers with
  the rows it found but not their keys; every row carries its own key in a reserved tag
  (``eventlog.key``), so a lookup names exactly the missing keys (MissingRowsError), and the
  row count of every answer is checked again.
- TQ reads only the fields that *all* requested rows have; we record each row's field names in
  a reserved tag (``eventlog.fields``) and read rows with different field sets separately.
- A TQ put merges tags and keeps fields the new row lacks; an upsert here deletes the old row
  first, so the new row replaces it whole (between the two a reader sees the key missing).
- Non-scalar fields come back as jagged nested tensors; we unbind them, one tensor per row.
- Partitions stay listed after their last key is cleared; we list only partitions with rows.
- TQ's global index is reused after clears: it never leaves this module.

Lifecycle: `start_transferqueue` starts Ray in a temp dir we own and TQ on it;
`stop_transferqueue` closes both and kills any process of that session still alive, by PID
(see `eventlog.dataplane.raysession`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import psutil

# Read by transfer_queue at import time (threads per TQ call; its default of 8 makes TQ log a
# warning on every call on small machines) and inherited by the Ray actors started later.
os.environ.setdefault("TQ_NUM_THREADS", str(max(1, min(8, psutil.cpu_count(logical=False) or 1))))

import ray
import torch
import transfer_queue as tq
from tensordict import TensorDict

from eventlog.dataplane._rows import (
    CheckedRow,
    check_keys,
    check_partition,
    check_rows,
)
from eventlog.dataplane.files import make_folder_durably
from eventlog.dataplane.protocol import (
    RESERVED_TAG_PREFIX,
    DataPlaneCheckpoint,
    Row,
    inventory_digest,
)
from eventlog.dataplane.raysession import (
    MARKER_ENV,
    TEMP_ROOT_ENV,
    kill_ray_session,
    session_pids,
)
from eventlog.recovery.errors import DataPlaneError, MissingRowsError

logger = logging.getLogger(__name__)

FIELDS_TAG = RESERVED_TAG_PREFIX + "fields"
"""Reserved tag holding the JSON list of a row's field names."""
KEY_TAG = RESERVED_TAG_PREFIX + "key"
"""Reserved tag holding the row's own key: TQ's per-key lookups answer without keys."""
CHECKPOINT_SUBDIR = "transferqueue"
"""TQ's own checkpoint directory inside the directory given to `save_checkpoint`."""

# Ray's longest socket path is <temp dir>/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store
# (64 bytes after the temp dir with a 7-digit pid) and must fit in AF_UNIX's 107 bytes.
_MAX_TEMP_DIR_BYTES = 107 - 64

_TQ_CONFIG: dict[str, Any] = {
    "controller": {"polling_mode": True},
    # The default of two storage units hangs on two-CPU machines.
    "backend": {"storage_backend": "SimpleStorage", "SimpleStorage": {"num_data_storage_units": 1}},
}


class TransferQueueDataPlane:
    """`DataPlane` over the TQ this process started or joined (`tq.init` must have run)."""

    def __init__(self) -> None:
        try:
            tq.get_client()
        except AssertionError as exc:
            raise DataPlaneError(
                "TransferQueue is not initialised in this process",
                hint="call eventlog.dataplane.transferqueue.start_transferqueue() first",
            ) from exc

    # -- listing (costs a pass over the partition, or over every partition) -------------
    def list_partitions(self) -> list[str]:
        """Partitions that currently hold at least one row, sorted."""
        listing = _call("list partitions", tq.kv_list)
        return sorted(
            p for p, keys in listing.items() if any(_is_row(tags) for tags in keys.values())
        )

    def list_keys(self, partition: str) -> dict[str, dict[str, str]]:
        """Every staging key in the partition with its tags (empty dict when none)."""
        check_partition(partition)
        listing = _call(f"list partition {partition!r}", tq.kv_list, partition_id=partition)
        return {
            key: _user_tags(tags)
            for key, tags in listing.get(partition, {}).items()
            if _is_row(tags)
        }

    # -- rows (cost grows with the keys asked for, not with the partition) -------------
    def _present(self, partition: str, keys: list[str]) -> dict[str, list[str]]:
        """Which of `keys` hold a complete row: key -> its field names."""
        client = tq.get_client()
        meta = _call(
            f"look up {len(keys)} keys in {partition!r}",
            client.kv_retrieve_meta,
            keys=keys,
            partition_id=partition,
            create=False,
        )
        present: dict[str, list[str]] = {}
        for tags in meta.custom_meta:
            if _is_row(tags):
                present[tags[KEY_TAG]] = json.loads(tags[FIELDS_TAG])
        return present

    def put_rows(
        self,
        partition: str,
        rows: Mapping[str, Row],
        tags: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        """Upsert whole rows by key; returns after TQ acknowledged every row."""
        checked = check_rows(partition, rows, tags)
        if not checked:
            return
        stale = list(self._present(partition, [row.key for row in checked]))
        if stale:
            _call(f"clear {len(stale)} rows of {partition!r}", tq.kv_clear, stale, partition)
        for group in _group_by_signature(checked):
            names = sorted(group[0].fields)
            batch = TensorDict(
                {name: _pack([row.fields[name] for row in group]) for name in names},
                batch_size=[len(group)],
            )
            row_tags = [
                {**row.tags, KEY_TAG: row.key, FIELDS_TAG: json.dumps(names)} for row in group
            ]
            _call(
                f"put {len(group)} rows into {partition!r}",
                tq.kv_batch_put,
                keys=[row.key for row in group],
                partition_id=partition,
                fields=batch,
                tags=row_tags,
            )

    def read_rows(self, partition: str, keys: Sequence[str]) -> dict[str, Row]:
        """Rows for exactly these keys, one tensor per field; MissingRowsError otherwise."""
        check_partition(partition)
        wanted = check_keys(partition, keys)
        if not wanted:
            return {}
        present = self._present(partition, wanted)
        missing = [key for key in wanted if key not in present]
        if missing:
            raise MissingRowsError(partition, missing)
        by_fields: dict[tuple[str, ...], list[str]] = {}
        for key in wanted:
            by_fields.setdefault(tuple(present[key]), []).append(key)
        found: dict[str, Row] = {}
        for names, group in by_fields.items():
            try:
                batch = tq.kv_batch_get(
                    keys=group, partition_id=partition, select_fields=list(names)
                )
            except Exception as exc:  # TQ raises ValueError/RuntimeError for absent rows
                self._raise_missing(partition, group, f"TQ refused the read: {exc}", exc)
            if batch.batch_size[0] != len(group):
                self._raise_missing(
                    partition,
                    group,
                    f"TQ returned {batch.batch_size[0]} rows for {len(group)} keys",
                )
            columns = {name: _unbind(batch[name], len(group), partition, name) for name in names}
            for i, key in enumerate(group):
                found[key] = {name: columns[name][i] for name in names}
        return {key: found[key] for key in wanted}

    def _raise_missing(
        self, partition: str, group: list[str], why: str, exc: BaseException | None = None
    ) -> NoReturn:
        """A read came back short (a concurrent delete): name the keys that vanished."""
        gone = [key for key in group if key not in self._present(partition, group)]
        if gone:
            raise MissingRowsError(partition, gone) from exc
        raise DataPlaneError(f"partition {partition!r}: {why} (keys {group[:5]}…)") from exc

    def delete_rows(self, partition: str, keys: Iterable[str]) -> None:
        """Remove rows by key; absent keys and unknown partitions are ignored."""
        doomed = check_keys(check_partition(partition), keys)
        if doomed:
            _call(f"clear {len(doomed)} rows of {partition!r}", tq.kv_clear, doomed, partition)

    def clear(self) -> None:
        """Remove every row of every partition (and the partitions themselves)."""
        client = tq.get_client()
        for partition in _call("list partitions", client.get_partition_list):
            _call(f"clear partition {partition!r}", client.clear_partition, partition)

    # -- checkpoints --------------------------------------------------------------------
    def _inventory(self) -> list[tuple[str, str]]:
        listing = _call("list partitions", tq.kv_list)
        return sorted(
            (partition, key)
            for partition, keys in listing.items()
            for key, tags in keys.items()
            if _is_row(tags)
        )

    def save_checkpoint(self, directory: str) -> DataPlaneCheckpoint:
        """TQ checkpoint (controller state and storage) into ``directory/transferqueue``.

        Take it inside the barrier's checkpoint section: a put or delete while TQ saves makes
        this raise rather than record a digest that does not describe what was saved.
        """
        target = Path(directory).resolve()
        make_folder_durably(target)
        before = self._inventory()
        digest = inventory_digest(before)
        _call(
            f"save checkpoint to {str(target)!r}",
            tq.save_checkpoint,
            target / CHECKPOINT_SUBDIR,
            metadata={"inventory_digest": digest, "row_count": len(before)},
        )
        if self._inventory() != before:
            raise DataPlaneError(
                f"data-plane checkpoint {str(target)!r}: rows changed while TQ was saving; "
                "expected no puts or deletes during a checkpoint",
                hint="take data-plane checkpoints inside barrier.checkpoint()",
            )
        logger.info("saved TransferQueue data plane: %d rows to %s", len(before), target)
        return DataPlaneCheckpoint(ref=str(target), inventory_digest=digest, row_count=len(before))

    def load_checkpoint(self, checkpoint: DataPlaneCheckpoint) -> None:
        """Clear TQ, load the checkpoint, then check the loaded inventory against its digest."""
        source = Path(checkpoint.ref) / CHECKPOINT_SUBDIR
        if not (source / "metadata.json").is_file():
            raise DataPlaneError(
                f"data-plane checkpoint {checkpoint.ref!r}: expected {CHECKPOINT_SUBDIR}/"
                "metadata.json, found none (not a TransferQueue data-plane checkpoint?)"
            )
        # Clearing first frees storage-unit memory that the loaded controller would not know.
        self.clear()
        _call(f"load checkpoint {str(source)!r}", tq.load_checkpoint, source)
        loaded = self._inventory()
        found = inventory_digest(loaded)
        if found != checkpoint.inventory_digest:
            raise DataPlaneError(
                f"data-plane checkpoint {checkpoint.ref!r}: expected inventory digest "
                f"{checkpoint.inventory_digest} ({checkpoint.row_count} rows), "
                f"found {found} ({len(loaded)} rows)"
            )
        logger.info("loaded TransferQueue data plane: %d rows from %s", len(loaded), source)


def _is_row(tags: Mapping[str, object]) -> bool:
    """A key TQ knows whose row was completely written (our put sets both tags with the data)."""
    return FIELDS_TAG in tags and KEY_TAG in tags


def _user_tags(tags: Mapping[str, str]) -> dict[str, str]:
    return {t: v for t, v in tags.items() if not t.startswith(RESERVED_TAG_PREFIX)}


# -- tensors ----------------------------------------------------------------------------
def _group_by_signature(rows: list[CheckedRow]) -> list[list[CheckedRow]]:
    """Rows that TQ can take in one batch: same field names, dtypes and ranks."""
    groups: dict[tuple[tuple[str, str, int], ...], list[CheckedRow]] = {}
    for row in rows:
        signature = tuple(sorted((n, str(t.dtype), t.dim()) for n, t in row.fields.items()))
        groups.setdefault(signature, []).append(row)
    return list(groups.values())


def _pack(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One batched column: dense when shapes agree, else a nested tensor (jagged first)."""
    if all(t.shape == tensors[0].shape for t in tensors):
        return torch.stack(tensors)
    try:
        return torch.nested.as_nested_tensor(tensors, layout=torch.jagged)
    except (RuntimeError, TypeError, ValueError):  # ragged in more than one dimension
        return torch.nested.as_nested_tensor(tensors, layout=torch.strided)


def _unbind(column: object, count: int, partition: str, name: str) -> list[torch.Tensor]:
    """Split a column TQ returned (dense, nested, or a stack of objects) into rows."""
    if isinstance(column, torch.Tensor):
        parts: list[object] = list(column.unbind(0))
    elif hasattr(column, "tolist"):  # NonTensorStack, when TQ could not batch mixed rows
        parts = list(column.tolist())
    else:
        raise DataPlaneError(
            f"partition {partition!r}, field {name!r}: TQ returned a {type(column).__name__}"
        )
    if len(parts) != count or not all(isinstance(p, torch.Tensor) for p in parts):
        raise DataPlaneError(
            f"partition {partition!r}, field {name!r}: expected {count} tensors, "
            f"found {len(parts)} values of types {sorted({type(p).__name__ for p in parts})}"
        )
    return [p for p in parts if isinstance(p, torch.Tensor)]


def _call(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run one TQ call, turning its errors into DataPlaneError naming what we were doing."""
    try:
        return fn(*args, **kwargs)
    except DataPlaneError:
        raise
    except Exception as exc:
        raise DataPlaneError(f"TransferQueue failed to {what}: {exc}") from exc


# -- lifecycle --------------------------------------------------------------------------
@dataclass(frozen=True)
class TransferQueueRuntime:
    """A Ray + TQ started by this process: where its temp dir is and which PIDs it has."""

    temp_dir: str
    """Ray's temp dir (sessions, sockets, logs); every process of it carries MARKER_ENV."""
    pids: tuple[int, ...]
    """Ray and TQ processes alive right after start (recorded in ``eventlog-ray.json``)."""
    start_seconds: float


def start_transferqueue(*, temp_root: str | None = None, num_cpus: int = 3) -> TransferQueueRuntime:
    """Start a loopback-only Ray and TQ (one SimpleStorage unit) owned by this process.

    ``temp_root`` (default ``$EVENTLOG_RAY_TMPDIR``, else the system temp dir) receives a new
    ``ray-*`` directory; ``kill_ray_session(temp_root)`` stops every session under
    it, even after this process was SIGKILLed. TQ takes two Ray CPUs, hence ``num_cpus=3``.
    """
    if ray.is_initialized():
        raise DataPlaneError(
            "Ray is already initialised in this process; start_transferqueue owns its own Ray",
            hint="use TransferQueueDataPlane() on the TQ that is already running",
        )
    if num_cpus < 3:
        raise DataPlaneError(f"num_cpus: expected at least 3 (TQ takes 2), found {num_cpus}")
    root = temp_root or os.environ.get(TEMP_ROOT_ENV) or tempfile.gettempdir()
    os.makedirs(root, exist_ok=True)
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir=root)
    if len(temp_dir.encode()) > _MAX_TEMP_DIR_BYTES:
        os.rmdir(temp_dir)
        raise DataPlaneError(
            f"Ray temp dir {temp_dir!r}: expected at most {_MAX_TEMP_DIR_BYTES} bytes, found "
            f"{len(temp_dir.encode())} (Ray's Unix socket paths under it are limited to 107 bytes)",
            hint=f"pass a shorter temp_root or set {TEMP_ROOT_ENV} (e.g. /tmp)",
        )
    # Ray ignores _node_ip_address on Linux and binds other interfaces unless told not to.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    started = time.monotonic()
    try:
        previous = os.environ.get(MARKER_ENV)
        os.environ[MARKER_ENV] = temp_dir  # inherited by the Ray processes spawned now only
        try:
            ray.init(
                num_cpus=num_cpus,
                _node_ip_address="127.0.0.1",
                include_dashboard=False,
                _temp_dir=temp_dir,
                log_to_driver=False,  # TQ's actors log every call; their logs stay in temp_dir
            )
        finally:
            if previous is None:
                os.environ.pop(MARKER_ENV, None)
            else:
                os.environ[MARKER_ENV] = previous
        tq.init(_TQ_CONFIG)
    except Exception as exc:
        _shutdown_quietly()
        kill_ray_session(temp_dir)
        raise DataPlaneError(
            f"could not start TransferQueue on Ray (temp dir {temp_dir}): {exc}"
        ) from exc
    runtime = TransferQueueRuntime(
        temp_dir=temp_dir,
        pids=tuple(session_pids(temp_dir)),
        start_seconds=time.monotonic() - started,
    )
    Path(temp_dir, "eventlog-ray.json").write_text(
        json.dumps({"driver_pid": os.getpid(), "pids": list(runtime.pids)})
    )
    logger.info(
        "started Ray + TransferQueue in %.1f s (temp dir %s, pids %s)",
        runtime.start_seconds,
        temp_dir,
        list(runtime.pids),
    )
    return runtime


def join_transferqueue() -> TransferQueueDataPlane:
    """The data plane of the TQ already running in this Ray cluster (e.g. inside an actor)."""
    if not ray.is_initialized():
        raise DataPlaneError("Ray is not initialised in this process; nothing to join")
    _call("join the running TransferQueue", tq.init)
    return TransferQueueDataPlane()


def _shutdown_quietly() -> None:
    for step, fn in (("tq.close", tq.close), ("ray.shutdown", ray.shutdown)):
        try:
            fn()
        except Exception:
            logger.warning("%s failed during TransferQueue shutdown", step, exc_info=True)


def stop_transferqueue(runtime: TransferQueueRuntime, *, remove_temp_dir: bool = True) -> list[int]:
    """Close TQ, shut Ray down, then kill by PID any process of the session still alive.

    Returns the PIDs that had to be killed (empty after a clean shutdown).
    """
    _shutdown_quietly()
    leftovers = kill_ray_session(runtime.temp_dir)
    if leftovers:
        logger.warning("killed %d Ray processes left after shutdown: %s", len(leftovers), leftovers)
    if remove_temp_dir:
        shutil.rmtree(runtime.temp_dir, ignore_errors=True)
    return leftovers
